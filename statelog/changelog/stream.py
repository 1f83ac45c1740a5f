"""A changelog stream: the ordered change records of one state of one subtask attempt.

Appending is lock-free: the task thread extends ``stream.buf`` by one fixed-width record
(layouts in :mod:`statelog.changelog.records`); every ``encode_batch_records`` records it
converts its buffer to Arrow itself (while the records are hot in its cache), and the
flusher of the :class:`~statelog.changelog.writer.ChangelogWriter` ships the converted
batches, taking raw records only from slow streams or when a checkpoint waits for them. A
stream's position is the number of records ever appended to it; the records of the stream
have sequence numbers ``0, 1, 2, ...``.

When the C extension is built, a narrow stream's buffer is a columnar ``RecordBuffer``
(``statelog/_ext/fastpath.c``) instead of a flat list: same ``extend(record)`` and ``len``
(in list items), but the records are stored as typed columns that become Arrow arrays
without per-record work (:func:`statelog.changelog.records.narrow_columns`).

A stream reaches the writer that flushes it only through :class:`StreamSink` (the writer
implements it), so this module does not depend on the writer.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from statelog.changelog import records
from statelog.changelog.encoder import BlockEncoder, EncodedBatch
from statelog.changelog.ops import OVERWRITING_OPS, Op
from statelog.changelog.segment_ref import SegmentRef
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import StatelogError, WriterFailedError

try:
    from statelog._ext import fastpath as _fastpath
except ImportError:  # not built: narrow streams buffer flat lists
    _fastpath = None
# Whether narrow streams can buffer their records as columns (RecordBuffer).
HAVE_RECORD_BUFFER = _fastpath is not None


class StreamSink(Protocol):
    """What a stream needs from the writer that flushes it (:class:`ChangelogWriter`)."""

    columnar: bool  # narrow streams buffer columns (RecordBuffer)
    coalesce: bool
    encode_in_task: bool
    encode_batch_records: int
    max_buffered_records: int
    flush_records: int
    encoder: BlockEncoder

    def wake(self) -> None:
        """Wake the flusher."""

    def wait_writable(self, stream: ChangelogStream) -> None:
        """Block a throttled task until back-pressure is lifted (or the writer failed)."""

    def wait_drained(self, stream: ChangelogStream) -> None:
        """Block until the flusher took the stream below ``max_buffered_records``."""

    def fail(self, exc: BaseException) -> WriterFailedError:
        """Fail the writer with ``exc``; the error the task raises."""


class ChangelogStream:
    """The ordered change records of one state of one subtask attempt."""

    def __init__(self, writer: StreamSink, stream_id: str, info: StateInfo, narrow: bool) -> None:
        self.writer = writer
        self.stream_id = stream_id
        self.info = info
        self.narrow = narrow
        self.width = records.NARROW_WIDTH if narrow else records.WIDE_WIDTH
        # flat list (``width`` items per record) or, for narrow streams, a RecordBuffer
        # (columns; the same ``extend`` and ``len``); ``take_raw`` empties either
        self.columnar = narrow and writer.columnar
        self.buf: Any = (
            _fastpath.RecordBuffer(records.buffer_value_kind(info.value_type))  # type: ignore[union-attr]
            if self.columnar
            else []
        )
        self.append: Callable[[tuple], None] = self.buf.extend
        self.owner: Any = None  # the state writing to this stream (its ``_append`` is swapped)
        self.lock = threading.Lock()
        self.taken = 0  # records handed to the flusher
        self.durable = 0  # every record below this seq is in an uploaded segment
        self.throttled = False  # set when the task must wait (back-pressure or failure)
        self._pending: list[list[Any]] = []  # [start, end, SegmentRef | None] in seq order
        self.segments: list[SegmentRef] = []  # uploaded, in seq order
        self._waiters: list[tuple[int, cf.Future[int]]] = []
        self.seals: list[int] = []  # sealed positions not yet taken: coalescing never crosses them
        # records the task thread already took out of its buffer, not yet taken by the
        # flusher: (start, count, batches converted to Arrow) for flat lists, (start, count,
        # (columns, seals)) for columnar buffers, which the flusher converts
        self.encoded: list[tuple[int, int, Any]] = []
        self.encoded_records = 0
        self.last_encode = time.monotonic()  # when the task thread last converted a batch
        self.closed = False
        # buffer length (items) at which the task calls on_buffer_full; limit_cell holds it
        # for the appending fast paths and drops to 0 while the writer applies back-pressure
        if writer.encode_in_task:
            self.normal_limit = writer.encode_batch_records * self.width
        else:
            self.normal_limit = writer.max_buffered_records * self.width
        self.limit_cell = [self.normal_limit]

    @property
    def position(self) -> int:
        """The sequence number the next record will get (call from the task thread)."""
        with self.lock:
            return self.taken + self.encoded_records + len(self.buf) // self.width

    @property
    def buffered(self) -> int:
        """Records appended but not yet taken by the flusher."""
        return self.encoded_records + len(self.buf) // self.width

    def on_buffer_full(self) -> None:
        """Called by the task thread when its buffer reached the batch size or the limit.

        Converts the buffered records to Arrow here, while they are hot in this thread's
        cache (cheaper than converting them later in the flusher), then waits if the
        flusher is behind by more than ``max_buffered_records``.
        """
        w = self.writer
        if self.throttled:
            w.wait_writable(self)
        if len(self.buf) < self.normal_limit:
            return
        if w.encode_in_task:
            self.encode_buffer()
        buffered = self.buffered
        if buffered >= w.flush_records:
            w.wake()
        if buffered >= w.max_buffered_records:
            w.wait_drained(self)

    def take_raw(self) -> tuple[Any, int]:
        """Remove the buffered records: ``(raw, count)`` for :meth:`encode_chunk` (call under
        ``self.lock``). The task may append meanwhile: a RecordBuffer hands over every record
        at once; a list is sliced up to the length read first (the task only appends past it).
        """
        buf = self.buf
        if self.columnar:
            raw = buf.take()
            return raw, raw[0]
        n = len(buf)
        width = self.width
        cols = [buf[i:n:width] for i in range(width)]
        del buf[:n]
        return cols, n // width

    def encode_buffer(self) -> None:
        with self.lock:
            if len(self.buf) == 0:
                return
            raw, count = self.take_raw()
            start = self.taken + self.encoded_records
            seals = sorted(p - start for p in self.seals if start < p < start + count)
            self.seals = [p for p in self.seals if p > start + count]
            if self.columnar:
                # the columns are already typed: wrapping them in Arrow arrays is left to the
                # flusher, since every pyarrow call releases the GIL, and a task thread that
                # releases it waits for the flusher to hand it back
                self.encoded.append((start, count, (raw, seals)))
            else:
                try:
                    batches = self.encode_chunk(start, raw, seals)
                except BaseException as e:
                    raise self.writer.fail(e) from e
                self.encoded.append((start, count, batches))
            self.encoded_records += count
            self.last_encode = time.monotonic()

    def append_columns(self, cols: list[Any], kg_range: tuple[int, int] | None = None) -> None:
        """Append the change records of one batch call, given as columns of the stream's
        layout (Arrow arrays or lists; :mod:`statelog.changelog.records`), as one block part:
        the records buffered before it are taken first, so sequence numbers keep the order of
        the calls. Back-pressure applies as for single records."""
        n = len(cols[records.C_KEY])
        if n == 0:
            return
        w = self.writer
        if self.throttled:
            w.wait_writable(self)
        if len(self.buf):
            self.encode_buffer()
        with self.lock:
            start = self.taken + self.encoded_records
            info = self.info
            try:
                batch = w.encoder.encode_batch(
                    info.name, info.value_type, info.user_key_type,
                    info.kind is StateKind.LIST, (start, n), cols, kg_range,
                )
            except BaseException as e:
                raise w.fail(e) from e
            self.encoded.append((start, n, [batch]))
            self.encoded_records += n
            self.last_encode = time.monotonic()
        buffered = self.buffered
        if buffered >= w.flush_records:
            w.wake()
        if buffered >= w.max_buffered_records:
            w.wait_drained(self)

    def encode_chunk(self, start: int, raw: Any, seals: list[int]) -> list[EncodedBatch]:
        """Convert a chunk (from :meth:`take_raw`) to Arrow, coalescing first if enabled.

        Coalescing never crosses a sealed checkpoint position: records before it must stay
        visible to that checkpoint.
        """
        info = self.info
        kg_range: tuple[int, int] | None = None
        if isinstance(raw, tuple):  # taken from a RecordBuffer
            cols, kg_min, kg_max = records.narrow_columns(raw, info.value_type)
            kg_range = (kg_min, kg_max)
        else:
            cols = raw
        n = len(cols[0])
        seqs: list[int] | tuple[int, int] = (start, n)
        if self.writer.coalesce:
            # the identity columns as lists (Arrow columns converted back)
            ident = [records.C_KEY, records.C_NS, records.C_OP] + ([] if self.narrow else [records.W_UKEY])
            pycols: list[Any] = [None] * len(cols)
            for i in ident:
                pycols[i] = cols[i].to_pylist() if isinstance(cols[i], pa.Array) else cols[i]
            keep: list[int] = []
            bounds = [0, *seals, n]
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                part = [None if c is None else c[lo:hi] for c in pycols]
                keep.extend(lo + i for i in _coalesce(part, self.narrow))
            if len(keep) < n:
                idx = pa.array(keep, pa.int64())
                cols = [c.take(idx) if isinstance(c, pa.Array) else [c[i] for i in keep] for c in cols]
                seqs = [start + i for i in keep]
                kg_range = None
        return [
            self.writer.encoder.encode_batch(
                info.name, info.value_type, info.user_key_type,
                info.kind is StateKind.LIST, seqs, cols, kg_range,
            )
        ]

    def set_throttled(self, throttled: bool) -> None:
        """Route the owner's appends through a blocking path while back-pressure applies.

        Two routes: owners that append through ``owner._append`` get a blocking append;
        fast paths that check ``len(buf) >= limit_cell[0]`` after each record see a limit of
        0 and call :meth:`on_buffer_full`, which waits.
        """
        self.throttled = throttled
        self.limit_cell[0] = 0 if throttled else self.normal_limit
        owner = self.owner
        if owner is not None:
            owner._append = self._throttled_append if throttled else self.append

    def _throttled_append(self, record: tuple) -> None:
        self.writer.wait_writable(self)
        self.buf.extend(record)

    def segments_for(self, start: int, end: int) -> list[SegmentRef]:
        """Uploaded segments holding records of ``[start, end)`` (all must be durable)."""
        with self.lock:
            if end > self.durable:
                raise StatelogError(
                    f"stream {self.stream_id}: records up to {end} are not durable yet (durable: {self.durable})"
                )
            return [s for s in self.segments if s.end > start and s.start < end]


def _coalesce(cols: list[Any], narrow: bool) -> list[int]:
    """Indexes of the records (of one state's chunk, as columns) that survive coalescing.

    A record is dropped when a later record of the same key and namespace overwrites the
    whole entry (put, delete, list replace), or, for map entries, when a later put/remove
    of the same map key replaces it. Timer records are never dropped.
    """
    keep: list[int] = []
    overwritten: set[tuple] = set()
    entry_ops: set[tuple] = set()
    overwriting = OVERWRITING_OPS
    map_ops = (Op.MAP_PUT.value, Op.MAP_REMOVE.value)
    kbs, nss, ops = cols[records.C_KEY], cols[records.C_NS], cols[records.C_OP]
    ukeys = None if narrow else cols[records.W_UKEY]
    for i in range(len(kbs) - 1, -1, -1):
        k = (kbs[i], nss[i])
        if k in overwritten:
            continue
        op = ops[i]
        if op in map_ops and ukeys is not None:
            ek = (*k, _hashable(ukeys[i]))
            if ek in entry_ops:
                continue
            entry_ops.add(ek)
        elif op in overwriting:
            overwritten.add(k)
        keep.append(i)
    keep.reverse()
    return keep


def _hashable(v: Any) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)
