"""The process-wide changelog writer.

Every state of every keyed backend in a process appends its change records to its own
:class:`ChangelogStream` (one per state and subtask attempt); one :class:`ChangelogWriter`
per process and job root collects the buffered records of *all* streams and uploads them as
one segment object per flush, so the number of objects stays low however many subtasks and
states a process runs. A flush happens when
the persist delay has passed (default 250 ms), when the buffered records exceed a threshold,
or at once when a checkpoint asks for durability.

Appending is lock-free: the task thread extends ``stream.buf`` by one fixed-width record
(layouts in :mod:`statelog.changelog.format`); every ``encode_batch_records`` records it
converts its buffer to Arrow itself (while the records are hot in its cache), and the
flusher ships the converted batches, taking raw records only from slow streams or when a
checkpoint waits for them. A stream's position is the number of records ever appended to
it; the records of the stream have sequence numbers ``0, 1, 2, ...``.

When the C extension is built, a compact stream's buffer is a columnar ``RecordBuffer``
(``statelog/_ext/fastpath.c``) instead of a flat list: same ``extend(record)`` and ``len``
(in list items), but the records are stored as typed columns that become Arrow arrays
without per-record work (:func:`statelog.changelog.format.compact_columns`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statelog.changelog import format as fmt
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import ConfigError, StatelogError, WriterFailedError
from statelog.store.base import ObjectStore
from statelog.store.retry import RetryPolicy, call_with_retry

log = logging.getLogger(__name__)

try:
    from statelog._ext import fastpath as _fastpath
except ImportError:  # not built: compact streams buffer flat lists
    _fastpath = None
# Compact streams buffer their records as columns (RecordBuffer) when the extension is built;
# STATELOG_PURE_PYTHON=1 keeps the flat lists (the reference layout). Read when a writer is
# created; ChangelogWriter(columnar=...) overrides it.
COLUMNAR_BUFFERS = _fastpath is not None and os.environ.get("STATELOG_PURE_PYTHON", "") in ("", "0")

CHANGELOG_PREFIX = "changelog/"
# A busy task converts its own records; the flusher converts a partial batch only after
# the task has not completed one for this many persist delays (a slow stream).
RAW_TAKE_DELAYS = 3
# The flusher's longest sleep between two looks at the buffers (see ChangelogWriter._run).
POLL_S = 0.05


@dataclass(frozen=True)
class SegmentRef:
    """One segment holding records ``[start, end)`` of a stream (``bytes`` of its blocks)."""

    name: str
    size: int
    start: int
    end: int
    bytes: int

    def to_json(self) -> list[Any]:
        return [self.name, self.size, self.start, self.end, self.bytes]

    @staticmethod
    def from_json(v: Any) -> SegmentRef:
        name, size, start, end, nbytes = v
        return SegmentRef(str(name), int(size), int(start), int(end), int(nbytes))


def new_writer_id() -> str:
    """Writer ids sort by creation time: ``<ms since epoch, 13 digits>-<random hex>``."""
    return f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}"


class ChangelogStream:
    """The ordered change records of one state of one subtask attempt."""

    def __init__(self, writer: ChangelogWriter, stream_id: str, info: StateInfo, compact: bool) -> None:
        self.writer = writer
        self.stream_id = stream_id
        self.info = info
        self.compact = compact
        self.width = fmt.COMPACT_WIDTH if compact else fmt.FULL_WIDTH
        # flat list (``width`` items per record) or, for compact streams, a RecordBuffer
        # (columns; the same ``extend`` and ``len``); ``take_raw`` empties either
        self.columnar = compact and writer.columnar
        self.buf: Any = (
            _fastpath.RecordBuffer(fmt.buffer_value_kind(info.value_type))  # type: ignore[union-attr]
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
            w._wait_writable(self)
        if len(self.buf) < self.normal_limit:
            return
        if w.encode_in_task:
            self.encode_buffer()
        buffered = self.buffered
        if buffered >= w.flush_records:
            w._wake.set()
        if buffered >= w.max_buffered_records:
            w._wait_drained(self)

    def take_raw(self) -> tuple[Any, int]:
        """Remove the buffered records: ``(raw, count)`` for ``writer._encode`` (call under
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
        w = self.writer
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
                    batches = w._encode(self, start, raw, seals)
                except BaseException as e:
                    w._fail(e)
                    raise w._failed_error() from e
                self.encoded.append((start, count, batches))
            self.encoded_records += count
            self.last_encode = time.monotonic()

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
        self.writer._wait_writable(self)
        self.buf.extend(record)

    def segments_for(self, start: int, end: int) -> list[SegmentRef]:
        """Uploaded segments holding records of ``[start, end)`` (all must be durable)."""
        with self.lock:
            if end > self.durable:
                raise StatelogError(
                    f"stream {self.stream_id}: records up to {end} are not durable yet (durable: {self.durable})"
                )
            return [s for s in self.segments if s.end > start and s.start < end]


class ChangelogWriter:
    """Batches the streams of one process into segment objects on the store."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        writer_id: str | None = None,
        persist_delay: float = 0.25,
        flush_records: int = 50_000,
        max_buffered_records: int = 500_000,
        max_inflight_bytes: int = 64 << 20,
        upload_threads: int = 2,
        coalesce: bool = False,
        compression_level: int = 1,
        compression: str = "zstd",
        retry: RetryPolicy | None = None,
        encode_in_task: bool = True,
        encode_batch_records: int = 4096,
        columnar: bool | None = None,
    ) -> None:
        if persist_delay < 0:
            raise ConfigError(f"persist_delay must be >= 0 seconds, got {persist_delay!r}")
        if max_inflight_bytes <= 0 or max_buffered_records <= 0 or flush_records <= 0:
            raise ConfigError("max_inflight_bytes, max_buffered_records and flush_records must be positive")
        self.store = store
        self.writer_id = writer_id or new_writer_id()
        self.persist_delay = persist_delay
        self.flush_records = flush_records
        self.max_buffered_records = max_buffered_records
        self.max_inflight_bytes = max_inflight_bytes
        self.coalesce = coalesce
        self.encode_in_task = encode_in_task
        # columnar buffers for compact streams (None: COLUMNAR_BUFFERS; needs the extension)
        self.columnar = (COLUMNAR_BUFFERS if columnar is None else columnar) and _fastpath is not None
        self.encode_batch_records = max(1, min(encode_batch_records, max_buffered_records))
        self.retry = retry or RetryPolicy()
        if compression not in fmt.BLOCK_CODECS:
            raise ConfigError(
                f"compression must be one of {', '.join(fmt.BLOCK_CODECS)} (changelog block codec), got {compression!r}"
            )
        self._encoder = fmt.BlockEncoder(compression_level, compression)
        self._streams: dict[str, ChangelogStream] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._take_all = False  # flush_soon: the next flush takes the partial batches too
        self._next_segment = 0
        self._inflight_bytes = 0
        self._failure: BaseException | None = None
        self._closed = False
        self.bytes_uploaded = 0
        self.segments_uploaded = 0
        self._uploads = cf.ThreadPoolExecutor(upload_threads, thread_name_prefix="statelog-upload")
        self._flusher = threading.Thread(target=self._run, name="statelog-flusher", daemon=True)
        self._flusher.start()
        # A writer left open at interpreter exit stops quietly (its unreferenced tail is
        # garbage either way: only published checkpoints make records count). The hook runs
        # with the threading shutdown hooks, before concurrent.futures stops its pools.
        ref = weakref.ref(self)
        threading._register_atexit(lambda: (w := ref()) is not None and w._stop_at_exit())  # type: ignore[attr-defined]

    # -- streams ---------------------------------------------------------------------------

    def open_stream(self, stream_id: str, info: StateInfo, compact: bool = False) -> ChangelogStream:
        """A new stream for one state; ``compact`` records carry no user key and no expiry."""
        self._check_usable()
        sid = stream_id
        with self._lock:
            if sid in self._streams:
                raise ConfigError(f"changelog stream {sid!r} is already open in this writer")
            stream = ChangelogStream(self, sid, info, compact)
            self._streams[sid] = stream
            return stream

    def close_stream(self, stream: ChangelogStream) -> None:
        with self._lock:
            stream.closed = True
            self._streams.pop(stream.stream_id, None)
            for _, fut in stream._waiters:
                fut.cancel()
            stream._waiters.clear()

    # -- durability --------------------------------------------------------------------------

    def persist(self, stream: ChangelogStream, upto: int) -> cf.Future[int]:
        """A future resolved (with ``upto``) once records ``< upto`` of ``stream`` are durable."""
        fut: cf.Future[int] = cf.Future()
        with self._lock:
            if self._failure is not None:
                fut.set_exception(self._failed_error())
                return fut
            if stream.durable >= upto:
                fut.set_result(upto)
                return fut
            stream._waiters.append((upto, fut))
            with stream.lock:
                if upto > stream.taken and upto not in stream.seals:
                    stream.seals.append(upto)
        self._wake.set()
        return fut

    def flush_soon(self) -> None:
        """Start uploading every buffered record now, without waiting for it.

        A checkpoint is coming (its barriers are on their way): what the flusher takes now is
        durable sooner, and the checkpoint's own flush (:meth:`persist` at the barrier) only
        has the records appended after this call left to upload.
        """
        self._take_all = True
        self._wake.set()

    def flush(self, timeout: float | None = None) -> None:
        """Make everything appended so far durable (blocks)."""
        futs = [self.persist(s, s.position) for s in list(self._streams.values())]
        for f in futs:
            f.result(timeout)

    @property
    def failed(self) -> BaseException | None:
        return self._failure

    def close(self, flush: bool = True) -> None:
        if self._closed:
            return
        if flush and self._failure is None:
            try:
                self.flush(timeout=60)
            except Exception:  # noqa: BLE001 - closing must not mask the original problem
                log.exception("changelog writer %s: final flush failed", self.writer_id)
        self._closed = True
        self._wake.set()
        self._flusher.join(timeout=10)
        self._uploads.shutdown(wait=True)

    def _stop_at_exit(self) -> None:
        if not self._closed:
            self._closed = True
            self._wake.set()
            self._flusher.join(timeout=5)

    # -- internals ---------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failed_error()
        if self._closed:
            raise StatelogError("the changelog writer is closed")

    def _failed_error(self) -> WriterFailedError:
        return WriterFailedError(
            f"changelog writer {self.writer_id} failed and cannot make changes durable: "
            f"{self._failure}; restart the task from its latest completed checkpoint"
        )

    def _wait_writable(self, stream: ChangelogStream) -> None:
        """Called by a throttled task: wait until the flusher lifts back-pressure."""
        self._wake.set()
        with self._cond:
            while True:
                if self._failure is not None:
                    raise self._failed_error()
                if not stream.throttled or stream.closed:
                    return
                if not self._cond.wait(0.05):
                    self._update_throttle_locked()

    def _wait_drained(self, stream: ChangelogStream) -> None:
        limit = self.max_buffered_records
        self._wake.set()
        with self._cond:
            while stream.buffered >= limit:
                if self._failure is not None:
                    raise self._failed_error()
                if stream.closed:
                    return
                self._wake.set()
                self._cond.wait(0.01)

    def _update_throttle_locked(self) -> None:
        """Throttle streams with too many buffered records, or all while uploads are over the cap."""
        over = self._inflight_bytes >= self.max_inflight_bytes or self._failure is not None
        changed = False
        for s in self._streams.values():
            should = over or s.buffered >= self.max_buffered_records
            if should != s.throttled:
                s.set_throttled(should)
                changed = True
        if changed:
            self._cond.notify_all()

    def _update_throttle(self) -> None:
        with self._cond:
            self._update_throttle_locked()

    def _run(self) -> None:
        # Checkpoints (persist), close and a task whose buffer passed flush_records wake the
        # flusher at once; the poll only bounds how late the persist delay and the record
        # threshold of streams appending through slow paths are noticed. Every wake-up takes
        # the GIL from the task threads, so it is rare.
        poll = min(self.persist_delay, POLL_S) if self.persist_delay > 0 else 0.001
        last = time.monotonic()
        while not self._closed:
            self._wake.wait(poll)
            woken = self._wake.is_set()
            if woken:
                self._wake.clear()
            now = time.monotonic()
            buffered = 0
            self._update_throttle()
            for s in list(self._streams.values()):
                n = s.buffered
                buffered += n
                if n and s._waiters:  # a checkpoint waits for records not yet taken
                    woken = True
            if not (woken or now - last >= self.persist_delay or buffered >= self.flush_records):
                continue
            last = now
            try:
                self._flush_once()
            except BaseException as e:  # noqa: BLE001 - the writer must fail loudly, not die silently
                log.exception("changelog writer %s: flush failed", self.writer_id)
                self._fail(e)
                return

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = exc
            waiters = []
            for s in self._streams.values():
                s.set_throttled(True)
                waiters.extend(s._waiters)
                s._waiters.clear()
            self._cond.notify_all()
        err = self._failed_error()
        for _, fut in waiters:
            if not fut.done():
                with contextlib.suppress(cf.InvalidStateError):  # cancelled meanwhile
                    fut.set_exception(err)

    def _flush_once(self) -> None:
        if self._failure is not None:
            return
        with self._cond:
            while self._inflight_bytes >= self.max_inflight_bytes and self._failure is None:
                self._update_throttle_locked()
                self._cond.wait(0.05)
        taken: list[tuple[ChangelogStream, int, int, Any]] = []
        raw: list[tuple[int, Any, list[int]]] = []
        now = time.monotonic()
        take_all, self._take_all = self._take_all, False
        for s in list(self._streams.values()):
            with s.lock:
                n = len(s.buf)
                # A busy task takes its records itself, batch by batch: ship those and leave
                # the partial batch to it, unless a checkpoint waits for it or the task has not
                # completed a batch within the persist delay (a slow stream).
                if (
                    self.encode_in_task
                    and not take_all
                    and s.encoded
                    and not s._waiters
                    and now - s.last_encode < RAW_TAKE_DELAYS * self.persist_delay
                ):
                    n = 0
                if n == 0 and not s.encoded:
                    continue
                cols, count = s.take_raw() if n else (None, 0)
                encoded, s.encoded = s.encoded, []
                start = s.taken
                raw_start = start + s.encoded_records
                s.encoded_records = 0
                s.taken = raw_start + count
                s._pending.append([start, s.taken, None])
                seals = sorted(p - raw_start for p in s.seals if raw_start < p < s.taken)
                s.seals = [p for p in s.seals if p > s.taken]
            taken.append((s, start, s.taken, encoded))
            raw.append((raw_start, cols, seals))
        if not taken:
            return
        with self._cond:
            self._cond.notify_all()  # tasks waiting for their buffer to drain
        converted: list[tuple[ChangelogStream, int, int, list[fmt.EncodedBatch]]] = []
        for (s, start, end, encoded), (raw_start, cols, seals) in zip(taken, raw, strict=True):
            batches: list[fmt.EncodedBatch] = []
            for chunk_start, _count, payload in encoded:
                if isinstance(payload, tuple):  # columns taken by the task
                    batches.extend(self._encode(s, chunk_start, payload[0], payload[1]))
                else:
                    batches.extend(payload)
            if cols is not None:
                batches.extend(self._encode(s, raw_start, cols, seals))
            converted.append((s, start, end, batches))
        taken = converted
        with self._lock:
            seg_no = self._next_segment
            self._next_segment += 1
        name = f"{CHANGELOG_PREFIX}{self.writer_id}/{seg_no:010d}.seg"
        parts = [fmt.encode_header()]
        offset = fmt.HEADER_SIZE
        blocks: list[fmt.BlockInfo] = []
        spans: list[fmt.StreamSpan] = []
        for s, start, end, batches in taken:
            size = 0
            if batches:
                data, raw_len, crc = self._encoder.write_block(batches)
                parts.append(data)
                blocks.append(
                    fmt.BlockInfo(
                        s.stream_id, s.info.name, offset, len(data), crc, raw_len,
                        sum(b.batch.num_rows for b in batches), batches[0].first_seq,
                        batches[-1].last_seq, min(b.kg_min for b in batches),
                        max(b.kg_max for b in batches),
                    )
                )
                offset += len(data)
                size = len(data)
            spans.append(fmt.StreamSpan(s.stream_id, start, end, size))
        footer = fmt.SegmentFooter(self.writer_id, seg_no, int(time.time() * 1000), tuple(blocks), tuple(spans))
        parts.append(fmt.encode_footer_and_trailer(footer, offset))
        data = b"".join(parts)
        with self._cond:
            self._inflight_bytes += len(data)
            self._update_throttle_locked()
        fut = self._uploads.submit(
            call_with_retry, self.retry, lambda: self.store.put(name, data), f"upload of {name}"
        )
        fut.add_done_callback(lambda f: self._uploaded(f, name, len(data), taken, spans))

    def _encode(
        self, stream: ChangelogStream, start: int, raw: Any, seals: list[int]
    ) -> list[fmt.EncodedBatch]:
        """Convert a chunk (from ``stream.take_raw``) to Arrow, coalescing first if enabled.

        Coalescing never crosses a sealed checkpoint position: records before it must stay
        visible to that checkpoint.
        """
        info = stream.info
        kg_range: tuple[int, int] | None = None
        if isinstance(raw, tuple):  # taken from a RecordBuffer
            cols, kg_min, kg_max = fmt.compact_columns(raw, info.value_type)
            kg_range = (kg_min, kg_max)
        else:
            cols = raw
        n = len(cols[0])
        seqs: list[int] | tuple[int, int] = (start, n)
        if self.coalesce:
            # the identity columns as lists (Arrow columns converted back)
            ident = [fmt.C_KEY, fmt.C_NS, fmt.C_OP] + ([] if stream.compact else [fmt.F_UKEY])
            pycols: list[Any] = [None] * len(cols)
            for i in ident:
                pycols[i] = cols[i].to_pylist() if isinstance(cols[i], pa.Array) else cols[i]
            keep: list[int] = []
            bounds = [0, *seals, n]
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                part = [None if c is None else c[lo:hi] for c in pycols]
                keep.extend(lo + i for i in _coalesce(part, stream.compact))
            if len(keep) < n:
                idx = pa.array(keep, pa.int64())
                cols = [c.take(idx) if isinstance(c, pa.Array) else [c[i] for i in keep] for c in cols]
                seqs = [start + i for i in keep]
                kg_range = None
        return [
            self._encoder.encode_batch(
                info.name, info.value_type, info.user_key_type,
                info.kind is StateKind.LIST, seqs, cols, kg_range,
            )
        ]

    def _uploaded(
        self,
        fut: cf.Future[None],
        name: str,
        size: int,
        taken: list[tuple[ChangelogStream, int, int, list[fmt.EncodedBatch]]],
        spans: list[fmt.StreamSpan],
    ) -> None:
        exc = fut.exception()
        with self._cond:
            self._inflight_bytes -= size
            self._update_throttle_locked()
            self._cond.notify_all()
        if exc is not None:
            log.error("changelog writer %s: upload of %s failed: %s", self.writer_id, name, exc)
            self._fail(exc)
            return
        self.bytes_uploaded += size
        self.segments_uploaded += 1
        resolved: list[tuple[cf.Future[int], int]] = []
        with self._lock:
            for (s, start, _end, _batches), span in zip(taken, spans, strict=True):
                with s.lock:
                    for p in s._pending:
                        if p[0] == start:
                            p[2] = SegmentRef(name, size, span.start, span.end, span.bytes)
                            break
                    while s._pending and s._pending[0][2] is not None:
                        p = s._pending.pop(0)
                        s.segments.append(p[2])
                        s.durable = p[1]
                    if not s._pending:
                        s.durable = s.taken if s.taken >= s.durable else s.durable
                    keep = []
                    for upto, w in s._waiters:
                        if upto <= s.durable:
                            resolved.append((w, upto))
                        else:
                            keep.append((upto, w))
                    s._waiters = keep
        for w, upto in resolved:
            if not w.done():
                with contextlib.suppress(cf.InvalidStateError):  # cancelled by its owner meanwhile
                    w.set_result(upto)


def _coalesce(cols: list[Any], compact: bool) -> list[int]:
    """Indexes of the records (of one state's chunk, as columns) that survive coalescing.

    A record is dropped when a later record of the same key and namespace overwrites the
    whole entry (put, delete, list replace), or, for map entries, when a later put/remove
    of the same map key replaces it. Timer records are never dropped.
    """
    keep: list[int] = []
    overwritten: set[tuple] = set()
    entry_ops: set[tuple] = set()
    overwriting = fmt.OVERWRITING_OPS
    map_ops = (fmt.OP_MAP_PUT, fmt.OP_MAP_REMOVE)
    kbs, nss, ops = cols[fmt.C_KEY], cols[fmt.C_NS], cols[fmt.C_OP]
    ukeys = None if compact else cols[fmt.F_UKEY]
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
