"""Runtime operators: what a task chains and drives record by record.

Every operator receives records with :meth:`StreamOperator.process` (``value``, event
timestamp or ``None``, input index), watermarks with :meth:`StreamOperator.on_watermark`
and emits through its :class:`Output` (the next operator of the chain, or the task's
router to other tasks). Stateful operators own one statelog keyed backend each, created by
the task (restored when the job restores); at a barrier the task calls
:meth:`StreamOperator.snapshot` on every operator of its chain, in chain order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from runtime.api.functions import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ProcessContext,
)

if TYPE_CHECKING:
    from statelog.state.backend import KeyedStateBackend
    from statelog.state.snapshot import PendingSnapshot

KeySelector = Callable[[Any], Any]


class Output(Protocol):
    def emit(self, value: Any, ts: int | None) -> None: ...

    def watermark(self, wm: int) -> None: ...


class OperatorContext(Protocol):
    """What the task offers an operator at setup."""

    subtask: int
    parallelism: int
    max_parallelism: int
    run_id: str
    attempt: int

    def keyed_backend(self, uid: str) -> KeyedStateBackend: ...

    def snapshot_backend(self, backend: KeyedStateBackend, checkpoint_id: int) -> PendingSnapshot: ...

    def backend_checkpoint_completed(self, backend: KeyedStateBackend, checkpoint_id: int) -> None: ...


@dataclass
class OperatorSnapshot:
    """The synchronous part of one operator's checkpoint."""

    pending: list[PendingSnapshot] = field(default_factory=list)
    committables: Any = None  # handed to the coordinator (collect sink)


class StreamOperator:
    """Base of all operators. ``uid`` is required for stateful operators, sources and sinks."""

    stateful = False  # owns a keyed statelog backend
    name = "operator"

    def __init__(self, uid: str | None = None, name: str | None = None) -> None:
        self.uid = uid
        if name:
            self.name = name
        self.out: Output = _NO_OUTPUT
        self.watermark_value = MIN_WATERMARK

    def setup(self, ctx: OperatorContext, out: Output) -> None:
        self.ctx = ctx
        self.out = out

    def open(self) -> None:
        pass

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        raise NotImplementedError

    def on_watermark(self, wm: int) -> None:
        self.watermark_value = wm
        self.out.watermark(wm)

    def on_processing_time(self, now_ms: int) -> None:
        pass

    def snapshot(self, checkpoint_id: int) -> OperatorSnapshot | None:
        return None

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return f"{self.name}[{self.uid}]" if self.uid else self.name


class _NoOutput:
    def emit(self, value: Any, ts: int | None) -> None:
        raise RuntimeError("operator is not wired to an output")

    def watermark(self, wm: int) -> None:
        pass


_NO_OUTPUT = _NoOutput()


class ChainedOutput:
    """Output into the next operator of the same task (a direct call)."""

    __slots__ = ("op", "emit")

    def __init__(self, op: StreamOperator) -> None:
        self.op = op
        process = op.process

        def emit(value: Any, ts: int | None) -> None:
            process(value, ts, 0)

        self.emit = emit  # type: ignore[method-assign]

    def watermark(self, wm: int) -> None:
        self.op.on_watermark(wm)


# -- stateless -----------------------------------------------------------------------------------


class MapOperator(StreamOperator):
    name = "map"

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None) -> None:
        super().__init__(None, name)
        self.fn = fn

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        self.out.emit(self.fn(value), ts)


class FilterOperator(StreamOperator):
    name = "filter"

    def __init__(self, fn: Callable[[Any], bool], name: str | None = None) -> None:
        super().__init__(None, name)
        self.fn = fn

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        if self.fn(value):
            self.out.emit(value, ts)


class FlatMapOperator(StreamOperator):
    name = "flat_map"

    def __init__(self, fn: Callable[[Any], Iterable[Any] | None], name: str | None = None) -> None:
        super().__init__(None, name)
        self.fn = fn

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        out = self.fn(value)
        if out is not None:
            emit = self.out.emit
            for v in out:
                emit(v, ts)


# -- keyed ---------------------------------------------------------------------------------------


class KeyedOperator(StreamOperator):
    """An operator with a keyed statelog backend; ``selectors[i]`` keys input ``i``."""

    stateful = True

    def __init__(self, uid: str, selectors: tuple[KeySelector, ...], name: str | None = None) -> None:
        super().__init__(uid, name)
        self.selectors = selectors

    def setup(self, ctx: OperatorContext, out: Output) -> None:
        super().setup(ctx, out)
        assert self.uid is not None
        self.backend = ctx.keyed_backend(self.uid)

    def snapshot(self, checkpoint_id: int) -> OperatorSnapshot | None:
        return OperatorSnapshot([self.ctx.snapshot_backend(self.backend, checkpoint_id)])

    def prefetch(self, records: list[tuple[Any, Any]], input_index: int) -> None:
        """Read the state of a frame's keys in one batch before its records are processed
        (a disk-backed working set: KeyedStateBackend.prefetch). A record whose key cannot
        be selected is left to process(), which reports it."""
        select = self.selectors[input_index]
        keys = []
        for value, _ts in records:
            try:
                keys.append(select(value))
            except Exception:  # noqa: BLE001,S112 - process() raises it for its record
                continue
        self.backend.prefetch(keys)

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        self.ctx.backend_checkpoint_completed(self.backend, checkpoint_id)

    def on_processing_time(self, now_ms: int) -> None:
        timers = self.backend.timers
        nxt = timers.next_timestamp("processing")
        if nxt is not None and nxt <= now_ms:
            for t in timers.advance_processing_time(now_ms):
                self.on_timer(t.timestamp, t.namespace, "processing")

    def on_watermark(self, wm: int) -> None:
        self.watermark_value = wm
        timers = self.backend.timers
        nxt = timers.next_timestamp("event")
        if nxt is not None and nxt <= wm:
            for t in timers.advance_watermark(wm):
                self.on_timer(t.timestamp, t.namespace, "event")
        self.out.watermark(wm)

    def on_timer(self, timestamp: int, namespace: Any, domain: str) -> None:
        pass

    def close(self) -> None:
        self.backend.close()


def _emit_all(out: Output, result: Iterable[Any] | None, ts: int | None) -> None:
    if result is not None:
        emit = out.emit
        for v in result:
            emit(v, ts)


class KeyedProcessOperator(KeyedOperator):
    """Runs a :class:`KeyedProcessFunction` (one input) or :class:`KeyedCoProcessFunction`."""

    name = "process"

    def __init__(
        self,
        uid: str,
        fn: KeyedProcessFunction | KeyedCoProcessFunction,
        selectors: tuple[KeySelector, ...],
        name: str | None = None,
    ) -> None:
        super().__init__(uid, selectors, name)
        self.fn = fn

    def open(self) -> None:
        self.pctx = ProcessContext(self.backend, self.ctx.subtask, self.ctx.parallelism, self.uid or "")
        self.fn.open(self.pctx)
        fn = self.fn
        if isinstance(fn, KeyedCoProcessFunction):
            self._handlers = (fn.process_element1, fn.process_element2)
        else:
            self._handlers = (fn.process_element,)  # type: ignore[union-attr]

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        self.backend.set_current_key(self.selectors[input_index](value))
        pctx = self.pctx
        pctx.timestamp = ts
        _emit_all(self.out, self._handlers[input_index](value, pctx), ts)

    def on_watermark(self, wm: int) -> None:
        self.pctx.current_watermark = wm
        super().on_watermark(wm)

    def on_timer(self, timestamp: int, namespace: Any, domain: str) -> None:
        pctx = self.pctx
        pctx.timestamp = timestamp
        pctx.time_domain = domain
        try:
            result = self.fn.on_timer(timestamp, pctx)
            _emit_all(self.out, result, timestamp if domain == "event" else None)
        finally:
            pctx.time_domain = None

    def close(self) -> None:
        try:
            self.fn.close()
        finally:
            super().close()


__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "ChainedOutput",
    "FilterOperator",
    "FlatMapOperator",
    "KeyedOperator",
    "KeyedProcessOperator",
    "MapOperator",
    "OperatorSnapshot",
    "StreamOperator",
]
