"""The output side of a task: records partitioned onto channels, events broadcast.

An :class:`EdgeOutput` buffers records per channel and sends a frame when a buffer holds
``batch_size`` records, when the task flushes (after every step) or in front of an event;
events (watermarks, barriers) go to every channel of every output edge, after the records
buffered before them. ``hash`` edges route by key group:
``subtask_for_key_group(max_parallelism, parallelism, key_group_of(key))``, the assignment
the statelog backends of the downstream subtasks check. A ``hash`` edge keyed by a column
(``key_by("name")``: :class:`~runtime.network.batch_router.ColumnKey`) splits each Arrow
record batch by the key groups of that column, vectorized
(:func:`~runtime.network.batch_router.split_by_key_group`, the same hash), and sends each
subtask's part at once as a frame of its own: a batch is one element of a channel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from runtime.api.functions import MAX_WATERMARK
from runtime.graph import FORWARD
from runtime.network.batch_router import ColumnKey, split_by_key_group
from statelog.keys.groups import key_group_of, subtask_for_key_group


class ChannelOutput(Protocol):
    label: str
    backpressured_s: float

    def send(self, frame: tuple[list[Any], Any]) -> None: ...

    def send_urgent(self, frame: tuple[list[Any], Any]) -> None: ...

    def take_queued(self) -> list[Any]: ...

    def requeue(self, items: list[Any]) -> None: ...

    def has_room(self, frame_records: int = 1) -> bool: ...

    def frame_limit(self, batch_size: int) -> int: ...

    def buffered(self) -> tuple[int, int]: ...

    def backlog(self) -> int: ...

    def close(self) -> None: ...


class EdgeOutput:
    def __init__(
        self,
        partition: str,
        key_selector: Callable[[Any], Any] | None,
        channels: Sequence[ChannelOutput],
        max_parallelism: int,
        batch_size: int,
    ) -> None:
        self.channels = list(channels)
        self.buffers: list[list[tuple[Any, int | None]]] = [[] for _ in self.channels]
        self.batch_size = batch_size
        # records per frame, per channel: ``batch_size``, less on a debloated channel whose
        # bound is smaller (refreshed by :meth:`has_room`)
        self.limits = [batch_size] * len(self.channels)
        self.forward = partition == FORWARD
        self.key_selector = key_selector
        self.max_parallelism = max_parallelism
        self._route: dict[Any, int] = {}
        self.sent_records = 0  # records handed to the channels (counted per frame; the metrics)
        if isinstance(key_selector, ColumnKey) and not self.forward:
            self.emit = self._emit_column  # type: ignore[method-assign]

    def _emit_column(self, value: Any, ts: int | None) -> None:
        """``emit`` of an edge keyed by a column: a record batch is split by key group."""
        if type(value) is not pa.RecordBatch:
            return EdgeOutput.emit(self, value, ts)
        name = self.key_selector.name  # type: ignore[union-attr]
        for i, part in enumerate(split_by_key_group(value, name, self.max_parallelism, len(self.channels))):
            if part is not None:
                buf = self.buffers[i]
                buf.append((part, ts))
                self.sent_records += len(buf)
                self.channels[i].send((buf, None))
                self.buffers[i] = []
        return None

    def emit(self, value: Any, ts: int | None) -> None:
        if self.forward:
            i = 0
        else:
            key = self.key_selector(value)  # type: ignore[misc]
            try:
                i = self._route[key]
            except KeyError:
                i = subtask_for_key_group(self.max_parallelism, len(self.channels), key_group_of(key, self.max_parallelism))
                if len(self._route) > 1 << 20:
                    self._route.clear()
                self._route[key] = i
            except TypeError:
                i = subtask_for_key_group(self.max_parallelism, len(self.channels), key_group_of(key, self.max_parallelism))
        buf = self.buffers[i]
        buf.append((value, ts))
        if len(buf) >= self.limits[i]:
            self.sent_records += len(buf)
            self.channels[i].send((buf, None))
            self.buffers[i] = []

    def event(self, event: tuple[str, int]) -> None:
        for i, ch in enumerate(self.channels):
            self.sent_records += len(self.buffers[i])
            ch.send((self.buffers[i], event))
            self.buffers[i] = []

    def flush(self) -> None:
        for i, buf in enumerate(self.buffers):
            if buf:
                self.sent_records += len(buf)
                self.channels[i].send((buf, None))
                self.buffers[i] = []

    def urgent_event(self, event: tuple[str, int]) -> None:
        """Send an event marked to overtake what the receivers queue (the caller decides
        where the buffered records go)."""
        for ch in self.channels:
            ch.send_urgent(([], event))

    def has_room(self) -> bool:
        room = True
        limits, bs = self.limits, self.batch_size
        for i, ch in enumerate(self.channels):
            limits[i] = limit = ch.frame_limit(bs)
            if not ch.has_room(limit):  # room for a whole frame: the bound is never exceeded
                room = False
        return room

    def backlog(self) -> int:
        return max((ch.backlog() for ch in self.channels), default=0)


class Router:
    """All output edges of a task's last operator (the chain's :class:`Output`)."""

    def __init__(self, edges: list[EdgeOutput], capacity: int) -> None:
        self.edges = edges
        self.capacity = capacity
        if len(edges) == 1:
            self.emit = edges[0].emit  # type: ignore[method-assign]
        self._wm: int | None = None

    def emit(self, value: Any, ts: int | None) -> None:
        for e in self.edges:
            e.emit(value, ts)

    def watermark(self, wm: int) -> None:
        if self._wm is None or wm > self._wm:
            self._wm = wm
            self.event(("wm", wm))

    def event(self, event: tuple[str, int]) -> None:
        for e in self.edges:
            e.event(event)

    def sent_final_watermark(self) -> bool:
        return self._wm is not None and self._wm >= MAX_WATERMARK

    def flush(self) -> None:
        for e in self.edges:
            e.flush()

    def has_capacity(self) -> bool:
        room = True
        for e in self.edges:
            if not e.has_room():
                room = False  # every channel still measures its back-pressured time
        return room

    def close(self) -> None:
        for e in self.edges:
            for ch in e.channels:
                ch.close()
