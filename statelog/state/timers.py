"""Per-key timers in event time and processing time, ordered and part of the state.

Timers are kept in sorted sets of ``(timestamp, key_bytes, namespace_bytes)`` (so keys of
any type order consistently) and deduplicated per (timestamp, key, namespace), as in
Flink. Adding and removing a timer -- including removal when it fires -- is a change record
of the pseudo-states ``__timers_event`` / ``__timers_processing`` (narrow records whose
value is the timestamp).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.ops import Op
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import StateTypeError
from statelog.keys.encoding import decode_key, encode_key
from statelog.restore.appliers import TimerApplier
from statelog.state.context import KeyContext

if TYPE_CHECKING:
    from statelog.changelog.stream import ChangelogStream

EVENT_TIME = "event"
PROCESSING_TIME = "processing"
TIMER_INFOS = tuple(StateInfo(name, StateKind.VALUE, pa.int64(), None, None) for name in TIMER_STATES)
# plain ints in records (the segment encoder caches the constant columns of exact ints)
_ADD, _REMOVE = Op.TIMER_ADD.value, Op.TIMER_REMOVE.value


@dataclass(frozen=True)
class Timer:
    timestamp: int
    key: Any
    namespace: Any
    domain: str  # "event" or "processing"


def _discard(_record: tuple) -> None:
    return None


class _TimerLog:
    """The change capture of one timer domain (owner of its changelog stream)."""

    def __init__(self, stream: ChangelogStream | None) -> None:
        self._stream = stream
        self._append: Callable[[tuple], None] = stream.append if stream is not None else _discard
        self._buf: list[Any] = stream.buf if stream is not None else []
        self._limit = stream.normal_limit if stream is not None else 1 << 62
        if stream is not None:
            stream.owner = self

    def emit(self, record: tuple) -> None:
        self._append(record)
        if len(self._buf) >= self._limit:
            self._stream.on_buffer_full()  # type: ignore[union-attr]


class TimerService:
    """Timers of one keyed backend, scoped to the current key of the backend's key context."""

    def __init__(
        self, ctx: KeyContext, streams: tuple[ChangelogStream | None, ChangelogStream | None]
    ) -> None:
        self._ctx = ctx
        self._sorted: tuple[Any, Any] | None = None
        self._logs = (_TimerLog(streams[0]), _TimerLog(streams[1]))
        self._appliers = (TimerApplier(TIMER_STATES[0]), TimerApplier(TIMER_STATES[1]))
        self.current_watermark: int | None = None

    @property
    def _sets(self) -> tuple[Any, Any]:
        """The timers of each domain in order (``sortedcontainers.SortedSet``, imported when a
        backend first touches its timers: most backends have none)."""
        if self._sorted is None:
            from sortedcontainers import SortedSet

            self._sorted = (SortedSet(), SortedSet())
        return self._sorted

    def _domain(self, domain: str) -> int:
        if domain == EVENT_TIME:
            return 0
        if domain == PROCESSING_TIME:
            return 1
        raise ValueError(f"timer domain must be 'event' or 'processing', got {domain!r}")

    def _add(self, d: int, timestamp: int, namespace: Any) -> None:
        if type(timestamp) is not int:
            raise StateTypeError(f"timer timestamps are int milliseconds, got {type(timestamp).__name__}")
        ctx = self._ctx
        hash(ctx.key)  # fails clearly when no current key is set
        ki = ctx.key_info
        entry = (timestamp, ki[1], encode_key(namespace))
        s = self._sets[d]
        if entry in s:
            return
        s.add(entry)
        self._logs[d].emit((ki[1], ki[2], entry[2], _ADD, timestamp))

    def _delete(self, d: int, timestamp: int, namespace: Any) -> None:
        ki = self._ctx.key_info
        entry = (timestamp, ki[1], encode_key(namespace))
        s = self._sets[d]
        if entry not in s:
            return
        s.remove(entry)
        self._logs[d].emit((ki[1], ki[2], entry[2], _REMOVE, timestamp))

    def register_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._add(0, timestamp, namespace)

    def delete_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._delete(0, timestamp, namespace)

    def register_processing_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._add(1, timestamp, namespace)

    def delete_processing_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        self._delete(1, timestamp, namespace)

    def next_timestamp(self, domain: str = EVENT_TIME) -> int | None:
        s = self._sets[self._domain(domain)]
        return s[0][0] if s else None

    def _fire(self, d: int, upto: int, domain: str) -> Iterator[Timer]:
        s = self._sets[d]
        ctx = self._ctx
        log = self._logs[d]
        while s and s[0][0] <= upto:
            ts, kb, nsb = s.pop(0)
            key = decode_key(kb)
            ctx.set_current_key(key)
            log.emit((kb, ctx.key_info[2], nsb, _REMOVE, ts))
            yield Timer(ts, key, decode_key(nsb), domain)

    def advance_watermark(self, watermark: int) -> Iterator[Timer]:
        """Remove and yield event-time timers ``<= watermark`` in order, setting the current key."""
        if self.current_watermark is None or watermark > self.current_watermark:
            self.current_watermark = watermark
        return self._fire(0, watermark, EVENT_TIME)

    def advance_processing_time(self, now: int) -> Iterator[Timer]:
        """Remove and yield processing-time timers ``<= now`` in order, setting the current key."""
        return self._fire(1, now, PROCESSING_TIME)

    def timers(self, domain: str = EVENT_TIME) -> list[Timer]:
        """All pending timers of a domain, in firing order."""
        return [
            Timer(ts, decode_key(kb), decode_key(nsb), domain)
            for ts, kb, nsb in self._sets[self._domain(domain)]
        ]

    def __len__(self) -> int:
        return 0 if self._sorted is None else len(self._sorted[0]) + len(self._sorted[1])

    def apply(self, d: int, kb: bytes, nsb: bytes, op: int, timestamp: int) -> None:
        """Apply one change record of domain ``d`` (restore path; :mod:`statelog.restore.appliers`)."""
        self._appliers[d].apply(self._sets[d], (timestamp, kb, nsb), op, None, timestamp, None)
