"""User functions of keyed operators and the contexts they receive.

A :class:`KeyedProcessFunction` (one input) or :class:`KeyedCoProcessFunction` (two keyed
inputs, e.g. a join) keeps keyed state in the operator's statelog backend and sets timers::

    class Count(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", pa.int64(), default=0))

        def process_element(self, value, ctx):
            self.count.update(self.count.value() + 1)
            ctx.timer_service().register_event_time_timer(ctx.timestamp + 1000)
            yield (ctx.current_key, self.count.value())

        def on_timer(self, timestamp, ctx):
            yield (ctx.current_key, "timer", timestamp)

Functions return (or yield) their outputs; ``None`` means no output. Outputs of
``process_element`` carry the input's timestamp, outputs of ``on_timer`` the timer's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statelog.descriptors import StateDescriptor
    from statelog.state.backend import KeyedStateBackend

MIN_WATERMARK = -(2**63)  # before any event (Flink's Long.MIN_VALUE)
MAX_WATERMARK = 2**63 - 1  # end of a bounded input


class TimerContext:
    """What ``ctx.timer_service()`` gives a keyed function: the current key's timers (event
    and processing time, milliseconds) and the current watermark and processing time.

    A view over the backend's :class:`statelog.state.timers.TimerService`, which stores the
    timers (in the changelog) and fires them; the operator drives that one.
    """

    def __init__(self, ctx: ProcessContext) -> None:
        self._ctx = ctx

    def current_watermark(self) -> int:
        return self._ctx.current_watermark

    def current_processing_time(self) -> int:
        return int(time.time() * 1000)

    def register_event_time_timer(self, timestamp: int) -> None:
        self._ctx._backend.timers.register_event_time_timer(timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._ctx._backend.timers.delete_event_time_timer(timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._ctx._backend.timers.register_processing_time_timer(timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._ctx._backend.timers.delete_processing_time_timer(timestamp)


class ProcessContext:
    """What a keyed function sees: its state, the current key and timestamp, timers.

    The same object is passed to ``open`` (no current key yet), ``process_element*`` and
    ``on_timer``.
    """

    def __init__(self, backend: KeyedStateBackend, subtask: int, parallelism: int, uid: str) -> None:
        self._backend = backend
        self.subtask_index = subtask
        self.parallelism = parallelism
        self.operator_uid = uid
        self.timestamp: int | None = None
        self.current_watermark = MIN_WATERMARK
        self.time_domain: str | None = None  # "event" / "processing" inside on_timer
        self._timers = TimerContext(self)

    @property
    def current_key(self) -> Any:
        return self._backend.current_key

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The keyed state of ``descriptor`` (restored on recovery), scoped to the current key."""
        return self._backend.get_state(descriptor)

    def timer_service(self) -> TimerContext:
        return self._timers

    @property
    def backend(self) -> KeyedStateBackend:
        return self._backend


class KeyedProcessFunction:
    """Processes the records of a keyed stream one by one, with keyed state and timers."""

    def open(self, ctx: ProcessContext) -> None:
        """Called once per subtask before any record; declare state here."""

    def process_element(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[Any] | None:
        return None

    def close(self) -> None:
        """Called when the subtask ends."""


class KeyedCoProcessFunction:
    """Processes two keyed streams with the same key (``connect``), e.g. a join."""

    def open(self, ctx: ProcessContext) -> None:
        """Called once per subtask before any record; declare state here."""

    def process_element1(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_element2(self, value: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: ProcessContext) -> Iterable[Any] | None:
        return None

    def close(self) -> None:
        """Called when the subtask ends."""
