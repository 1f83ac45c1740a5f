"""Event-time windows built on keyed state namespaces and timers.

A window is ``[start, end)`` in event-time milliseconds. For every record the assigner
yields its windows; the window operator folds the record into the reducing or aggregating
state of the window's namespace ``(start, end)`` and registers an event-time timer at the
window's last millisecond. When the watermark passes it, the timer fires (restored timers
fire the same way after a recovery), the operator emits the result and clears the window's
state. A record whose window has already fired (``end - 1 <= watermark``) is late and
dropped, as in Flink without allowed lateness; ``late_records`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.errors import JobGraphError
from runtime.task.operators import KeyedOperator, KeySelector
from statelog.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
)
from statelog.types import PICKLE

WINDOW_STATE = "window-contents"


@dataclass(frozen=True, order=True)
class TimeWindow:
    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1


class WindowAssigner:
    def assign(self, ts: int) -> list[TimeWindow]:
        raise NotImplementedError


@dataclass(frozen=True)
class TumblingEventTimeWindows(WindowAssigner):
    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        _check_ms("size_ms", self.size_ms, positive=True)
        _check_ms("offset_ms", self.offset_ms)

    def assign(self, ts: int) -> list[TimeWindow]:
        start = ts - (ts - self.offset_ms) % self.size_ms
        return [TimeWindow(start, start + self.size_ms)]


@dataclass(frozen=True)
class SlidingEventTimeWindows(WindowAssigner):
    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        _check_ms("size_ms", self.size_ms, positive=True)
        _check_ms("slide_ms", self.slide_ms, positive=True)
        _check_ms("offset_ms", self.offset_ms)

    def assign(self, ts: int) -> list[TimeWindow]:
        last = ts - (ts - self.offset_ms) % self.slide_ms
        return [TimeWindow(s, s + self.size_ms) for s in range(last, ts - self.size_ms, -self.slide_ms)]


def _check_ms(name: str, v: Any, positive: bool = False) -> None:
    if type(v) is not int or v < (1 if positive else 0):
        raise JobGraphError(f"window {name} must be an int of milliseconds{' > 0' if positive else ''}, got {v!r}")


WindowFunction = Callable[[Any, TimeWindow, Any], Any]


class WindowOperator(KeyedOperator):
    """Keyed event-time windows with incremental reduce or aggregate."""

    name = "window"

    def __init__(
        self,
        uid: str,
        selector: KeySelector,
        assigner: WindowAssigner,
        *,
        reduce_fn: Callable[[Any, Any], Any] | None = None,
        aggregate: AggregateFunction | None = None,
        window_function: WindowFunction | None = None,
        value_type: Any = PICKLE,
        name: str | None = None,
    ) -> None:
        super().__init__(uid, (selector,), name)
        if (reduce_fn is None) == (aggregate is None):
            raise JobGraphError("a window needs exactly one of reduce_fn and aggregate")
        self.assigner = assigner
        self.window_function = window_function
        if reduce_fn is not None:
            self.descriptor: Any = ReducingStateDescriptor(WINDOW_STATE, value_type, reduce_fn=reduce_fn)
        else:
            self.descriptor = AggregatingStateDescriptor(WINDOW_STATE, value_type, aggregate=aggregate)
        self.late_records = 0

    def open(self) -> None:
        self.state = self.backend.get_state(self.descriptor)
        self._register = self.backend.timers.register_event_time_timer

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        if ts is None:
            raise JobGraphError(
                f"window operator {self.uid!r} got a record without timestamp; give its source a "
                "WatermarkStrategy (env.from_source(..., watermarks=...))"
            )
        self.backend.set_current_key(self.selectors[0](value))
        wm = self.watermark_value
        state = self.state
        for w in self.assigner.assign(ts):
            if w.end - 1 <= wm:
                self.late_records += 1
                continue
            ns = (w.start, w.end)
            state.set_namespace(ns)
            state.add(value)
            self._register(w.end - 1, ns)

    def on_timer(self, timestamp: int, namespace: Any, domain: str) -> None:
        if domain != "event":
            return
        state = self.state
        state.set_namespace(namespace)
        result = state.get()
        state.clear()
        if result is None:
            return
        window = TimeWindow(namespace[0], namespace[1])
        wf = self.window_function
        out = wf(self.backend.current_key, window, result) if wf is not None else result
        self.out.emit(out, window.max_timestamp)
