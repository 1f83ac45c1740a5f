"""Reads changelog ranges back: verified, filtered by sequence range and key groups.

The reader is the mirror of the writer: it parses segment trailers and footers, reads the
blocks of one stream, checks every checksum and yields the change records of a
:class:`~statelog.checkpoint.metadata.ChangelogRange` in sequence order, per state.
"""

from __future__ import annotations

import collections
import pickle
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import integer_numpy, take_table
from statelog.changelog import format as fmt
from statelog.errors import CorruptionError, ObjectNotFoundError
from statelog.keys.groups import KeyGroupRange
from statelog.store.base import ObjectStore
from statelog.types import PICKLE, from_arrow

# a kept block (SegmentReader keep_bytes): its rows, their order by key group, and their key
# groups in that order
_KeptBlock = tuple[pa.Table, np.ndarray, np.ndarray]

WHOLE_OBJECT_LIMIT = 4 << 20  # segments up to this size are read with one request
TAIL_READ_BYTES = 64 << 10  # a larger segment's end read at once: its trailer and (mostly) its footer


@dataclass(frozen=True)
class ChangeBatch:
    """Decoded change records of one state from one block, in sequence order."""

    state: str
    table: pa.Table  # columns as in the block schema

    def rows(self) -> Iterator[tuple[int, int, int, bytes, bytes, Any, Any, int | None]]:
        """Yield ``(seq, key_group, op, key, namespace, user_key, value, expires_ms)``."""
        return zip(*self.columns(), strict=True)

    def columns(self) -> list[list[Any]]:
        """The columns of :meth:`rows` as Python lists (user keys and values decoded)."""
        t = self.table
        meta = t.schema.metadata or {}
        ukey_type = PICKLE if meta.get(fmt.META_UKEY_ENC) == b"pickle" else None
        cols = [t.column(i) for i in range(8)]
        ukeys = from_arrow(cols[5].combine_chunks(), ukey_type) if ukey_type is PICKLE else cols[5].to_pylist()
        return [*(c.to_pylist() for c in cols[:5]), ukeys, self.values(), cols[7].to_pylist()]

    def values(self) -> list[Any]:
        """The value column as Python values (decoded as :meth:`rows` gives them)."""
        col = self.table.column(6)
        values = col.to_pylist()
        if (self.table.schema.metadata or {}).get(fmt.META_VALUE_ENC) == b"pickle":
            if pa.types.is_list(col.type):
                return [None if v is None else [pickle.loads(x) for x in v] for v in values]
            return [None if v is None else pickle.loads(v) for v in values]
        if pa.types.is_map(col.type):
            return [None if v is None else dict(v) for v in values]
        return values


class SegmentReader:
    """Reads and verifies segment objects; caches parsed footers.

    Two kinds of failure, never confused: bytes that fail verification, and a segment that
    is missing although a checkpoint references it, raise :class:`CorruptionError` naming
    the segment (the data is damaged); a store that is unreachable or fails raises the
    store's :class:`~statelog.errors.StoreError` unchanged (its ``key`` is the segment,
    ``retryable`` tells whether to try again later).
    """

    def __init__(self, store: ObjectStore, keep_bytes: int = 0, tail_read_bytes: int = TAIL_READ_BYTES) -> None:
        self.store = store
        self._tail_read_bytes = tail_read_bytes  # a segment read in ranges: its last bytes read at once
        self._footers: dict[str, fmt.SegmentFooter] = {}
        self._whole: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        # with keep_bytes: the bytes of the segments read whole, and their blocks once decoded
        # with their rows' order by key group, kept (up to keep_bytes in all) for later reads of
        # other key groups, which then take their rows without a request or a second decoding
        self._keep_bytes = keep_bytes
        self._held: set[str] = set()  # segments whose bytes (in _whole) are kept
        self._kept: dict[tuple[str, int], _KeptBlock] = {}  # (segment, block offset)
        self._kept_size = 0
        # with linger_bytes (a reader that its owner trims, :meth:`trim`): the bytes of segments
        # read whole stay until then, for the other streams of the same segments
        self.linger_bytes = 0
        self._lingering: set[str] = set()
        self._lingering_size = 0

    def _get(self, name: str) -> bytes:
        try:
            data = self.store.get(name)
        except ObjectNotFoundError:
            raise CorruptionError(
                f"changelog segment {name} is missing from the store; the checkpoint that references "
                "it cannot be restored (restore an older or newer checkpoint)",
                key=name,
            ) from None
        self.bytes_read += len(data)
        return data

    def _range(self, name: str, offset: int, length: int) -> bytes:
        try:
            data = self.store.get_range(name, offset, length)
        except ObjectNotFoundError:
            raise CorruptionError(f"changelog segment {name} is missing from the store", key=name) from None
        self.bytes_read += len(data)
        return data

    def footer(self, name: str, size: int, whole_limit: int = WHOLE_OBJECT_LIMIT) -> fmt.SegmentFooter:
        """The verified footer of segment ``name``: a segment up to ``whole_limit`` bytes is
        read whole (its blocks are then read from those bytes), a larger one in ranges: its
        header, its last bytes (trailer and footer), and later each block it is asked for."""
        with self._lock:
            cached = self._footers.get(name)
        if cached is not None:
            return cached
        if size <= whole_limit:
            data = self._get(name)
            if len(data) != size:
                raise CorruptionError(
                    f"changelog segment {name} is {len(data)} bytes, the checkpoint recorded {size}",
                    key=name,
                )
            fmt.check_header(data, name)
            off, length, crc = fmt.parse_trailer(data[-fmt.TRAILER_SIZE :], name, size)
            footer = fmt.decode_footer(data[off : off + length], crc, name)
            with self._lock:
                self._whole[name] = data
        else:
            head = self._range(name, 0, fmt.HEADER_SIZE)
            fmt.check_header(head, name)
            start = max(fmt.HEADER_SIZE, size - self._tail_read_bytes)
            tail = self._range(name, start, size - start)
            if len(tail) != size - start:
                raise CorruptionError(
                    f"changelog segment {name} is shorter than the {size} bytes the checkpoint recorded", key=name
                )
            off, length, crc = fmt.parse_trailer(tail[-fmt.TRAILER_SIZE :], name, size)
            raw = tail[off - start : off - start + length] if off >= start else self._range(name, off, length)
            footer = fmt.decode_footer(raw, crc, name)
        with self._lock:
            self._footers[name] = footer
        return footer

    def block(self, name: str, info: fmt.BlockInfo) -> pa.Table:
        with self._lock:
            whole = self._whole.get(name)
        if whole is not None:
            data = whole[info.offset : info.offset + info.length]
        else:
            data = self._range(name, info.offset, info.length)
        return fmt.decode_block(data, info, name)

    def forget(self, name: str) -> None:
        with self._lock:
            self._whole.pop(name, None)

    def trim(self, footers: int) -> None:
        """Let go of the bytes of segments read whole (not kept; lingering ones too) and of all but the
        ``footers`` footers cached last: a reader that lives long (a follower's) reads each
        footer once and later only the blocks it is asked for."""
        with self._lock:
            for name in [n for n in self._whole if n not in self._held]:
                del self._whole[name]
            self._lingering.clear()
            self._lingering_size = 0
            for name in list(self._footers)[: max(0, len(self._footers) - footers)]:
                del self._footers[name]

    def drop_kept(self) -> None:
        """Let go of the blocks kept for later reads (``keep_bytes``)."""
        with self._lock:
            for name in self._held:
                self._whole.pop(name, None)
            self._held.clear()
            self._kept.clear()
            self._kept_size = 0

    @property
    def kept_bytes(self) -> int:
        return self._kept_size

    def read_range(
        self, stream: str, start: int, end: int, key_groups: KeyGroupRange, segments: Any,
        whole_limit: int = WHOLE_OBJECT_LIMIT, executor: Executor | None = None, ahead: int = 4,
    ) -> Iterator[ChangeBatch]:
        """Yield the change batches of ``stream`` with seq in ``[start, end)`` and key group in range.

        Segments up to ``whole_limit`` bytes are read whole, larger ones in ranges (a reader
        of a few blocks, e.g. of one key group, gives a small limit; :meth:`footer`). With an
        ``executor``, its threads read up to ``ahead`` segments at once (the footer and the
        blocks of each) ahead of the batches yielded: on a remote store, a range of several
        segments then waits for about one segment's requests instead of all of them in turn.

        The segments must cover ``[start, end)`` without a gap, and each must hold the span
        of ``stream`` the reference claims; otherwise records would be skipped silently, so
        this is a :class:`CorruptionError` naming the segment.
        """
        pos = start
        for seg in sorted(segments, key=lambda s: s.start):
            if seg.start > pos:
                break
            pos = max(pos, seg.end)
        if pos < end:
            names = ", ".join(s.name for s in segments) or "none"
            raise CorruptionError(
                f"changelog range [{start}, {end}) of stream {stream} is not covered by its segments "
                f"({names}): records from {pos} are missing; the checkpoint metadata is inconsistent",
                key=segments[-1].name if segments else None,
            )
        if executor is None:  # a block at a time
            loads: Iterator[Iterable[tuple[fmt.BlockInfo, pa.Table, bool]]] = (
                self._segment_blocks(stream, start, end, key_groups, seg, whole_limit) for seg in segments
            )
        else:
            loads = self._segment_blocks_ahead(stream, start, end, key_groups, segments, whole_limit, executor, ahead)
        for blocks in loads:
            for info, table, in_range in blocks:
                if info.first_seq < start or info.last_seq >= end:
                    seq = integer_numpy(table.column("seq"))
                    table = take_table(table, np.flatnonzero((seq >= start) & (seq < end)))
                if not in_range and (info.kg_min < key_groups.start or info.kg_max > key_groups.end):
                    kg = integer_numpy(table.column("key_group"))
                    table = take_table(table, np.flatnonzero((kg >= key_groups.start) & (kg <= key_groups.end)))
                if table.num_rows:
                    yield ChangeBatch(info.state, table)

    def _segment_blocks(
        self, stream: str, start: int, end: int, key_groups: KeyGroupRange, seg: Any, whole_limit: int
    ) -> Iterator[tuple[fmt.BlockInfo, pa.Table, bool]]:
        """The blocks of segment ``seg`` that may hold records of ``stream`` in ``[start, end)``
        and in ``key_groups``, each read, verified and decoded as it is iterated, as ``(info,
        rows, in_range)``: ``in_range`` when its rows are those of ``key_groups`` only (a kept
        block's), else unfiltered."""
        footer = self.footer(seg.name, seg.size, whole_limit)  # a failing store raises StoreError, never corruption
        if not any((sp.stream, sp.start, sp.end) == (stream, seg.start, seg.end) for sp in footer.streams):
            raise CorruptionError(
                f"changelog segment {seg.name} does not hold records [{seg.start}, {seg.end}) of stream "
                f"{stream}, which the checkpoint metadata references",
                key=seg.name,
            )
        keep = bool(self._keep_bytes) and seg.size <= whole_limit
        try:
            for info in footer.blocks:
                if info.stream != stream or info.last_seq < start or info.first_seq >= end:
                    continue
                if not key_groups.overlaps(info.kg_min, info.kg_max):
                    continue
                if not keep:
                    yield info, self.block(seg.name, info), False
                    continue
                table, order, kgs = self._kept_block(seg.name, info)
                lo, hi = np.searchsorted(kgs, key_groups.start, "left"), np.searchsorted(kgs, key_groups.end, "right")
                if lo < hi:
                    if lo > 0 or hi < len(kgs):  # a key group's rows are in order; several: sorted back
                        rows = order[lo:hi] if key_groups.start == key_groups.end else np.sort(order[lo:hi])
                        table = take_table(table, rows)
                    yield info, table, True
        finally:
            if not (keep and self._hold(seg.name, seg.size)) and not self._linger(seg.name):
                self.forget(seg.name)

    def _linger(self, name: str) -> bool:
        """Leave the bytes of segment ``name`` (read whole) for other streams' reads until
        :meth:`trim`, if ``linger_bytes`` leaves room."""
        with self._lock:
            data = self._whole.get(name)
            if data is None or name in self._lingering or self._lingering_size + len(data) > self.linger_bytes:
                return name in self._lingering
            self._lingering.add(name)
            self._lingering_size += len(data)
            return True

    def _hold(self, name: str, size: int) -> bool:
        """Keep the bytes of segment ``name`` (read whole) if ``keep_bytes`` leaves room."""
        with self._lock:
            if name in self._held:
                return True
            if name not in self._whole or self._kept_size + size > self._keep_bytes:
                return False
            self._held.add(name)
            self._kept_size += size
            return True

    def _kept_block(self, name: str, info: fmt.BlockInfo) -> _KeptBlock:
        """Block ``info`` of segment ``name`` decoded, with the order of its rows by key group
        (stable: a key group's rows stay in sequence order) and their key groups in that order;
        kept if ``keep_bytes`` leaves room."""
        with self._lock:
            kept = self._kept.get((name, info.offset))
        if kept is not None:
            return kept
        table = self.block(name, info)
        kgs = integer_numpy(table.column("key_group"))
        order = np.argsort(kgs, kind="stable")
        kept = (table, order, kgs[order])
        size = table.nbytes + order.nbytes + kgs.nbytes
        with self._lock:
            if (name, info.offset) not in self._kept and self._kept_size + size <= self._keep_bytes:
                self._kept[(name, info.offset)] = kept
                self._kept_size += size
        return kept

    def _read_segment(
        self, stream: str, start: int, end: int, key_groups: KeyGroupRange, seg: Any, whole_limit: int
    ) -> list[tuple[fmt.BlockInfo, pa.Table, bool]]:
        return list(self._segment_blocks(stream, start, end, key_groups, seg, whole_limit))

    def _segment_blocks_ahead(
        self, stream: str, start: int, end: int, key_groups: KeyGroupRange, segments: Any, whole_limit: int,
        executor: Executor, ahead: int,
    ) -> Iterator[list[tuple[fmt.BlockInfo, pa.Table, bool]]]:  # fmt: skip
        """The blocks of each segment in order (:meth:`_segment_blocks`), read by ``executor``'s
        threads up to ``ahead`` segments ahead of the caller, so that their requests wait on
        the store at the same time."""
        pending: collections.deque[Future[list[tuple[fmt.BlockInfo, pa.Table, bool]]] | list[tuple[fmt.BlockInfo, pa.Table, bool]]] = collections.deque()  # fmt: skip
        todo = iter(segments)
        try:
            while True:
                while len(pending) < max(1, ahead):
                    seg = next(todo, None)
                    if seg is None:
                        break
                    args = (stream, start, end, key_groups, seg, whole_limit)
                    with self._lock:
                        kept = seg.name in self._held
                    # a kept segment's bytes are at hand: its blocks are taken here, not by a thread
                    pending.append(self._read_segment(*args) if kept else executor.submit(self._read_segment, *args))
                if not pending:
                    return
                got = pending.popleft()
                yield got if isinstance(got, list) else got.result()
        finally:
            for fut in pending:
                if not isinstance(fut, list):
                    fut.cancel()

    def verify_segment(self, name: str, size: int | None = None) -> fmt.SegmentFooter:
        """Read and check every byte of a segment (header, footer, each block)."""
        if size is None:
            info = self.store.head(name)
            if info is None:
                raise CorruptionError(f"changelog segment {name} is missing from the store", key=name)
            size = info.size
        footer = self.footer(name, size)
        for b in footer.blocks:
            self.block(name, b)
        self.forget(name)
        return footer
