"""The process-wide changelog writer: flusher, uploads, durability, back-pressure.

Every state of every keyed backend in a process appends its change records to its own
:class:`~statelog.changelog.stream.ChangelogStream` (one per state and subtask attempt);
one :class:`ChangelogWriter` per process and job root collects the buffered records of
*all* streams and uploads them as one segment object per flush
(:func:`~statelog.changelog.segment.encode_segment`), so the number of objects stays low
however many subtasks and states a process runs. A flush happens when the persist delay has
passed (default 250 ms), when the buffered records exceed a threshold, or at once when a
checkpoint asks for durability. How tasks append and convert their records is described in
:mod:`statelog.changelog.stream`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any

from statelog.changelog import format as fmt
from statelog.changelog.encoder import BlockEncoder, EncodedBatch
from statelog.changelog.segment import SegmentRef, StreamChunk, encode_segment
from statelog.changelog.stream import HAVE_RECORD_BUFFER, ChangelogStream
from statelog.descriptors import StateInfo
from statelog.errors import ConfigError, FencedError, StatelogError, WriterFailedError
from statelog.layout import new_writer_id, segment_key
from statelog.options import WriterOptions
from statelog.store.base import ObjectStore
from statelog.store.retry import call_with_retry

log = logging.getLogger(__name__)

# Narrow streams buffer their records as columns (RecordBuffer) when the extension is built;
# STATELOG_PURE_PYTHON=1 keeps the flat lists (the reference layout). Read when a writer is
# created; ChangelogWriter(columnar=...) overrides it.
COLUMNAR_BUFFERS = HAVE_RECORD_BUFFER and os.environ.get("STATELOG_PURE_PYTHON", "") in ("", "0")

# A busy task converts its own records; the flusher converts a partial batch only after
# the task has not completed one for this many persist delays (a slow stream).
RAW_TAKE_DELAYS = 3
# The flusher's longest sleep between two looks at the buffers (see ChangelogWriter._run).
POLL_S = 0.05


class ChangelogWriter:
    """Batches the streams of one process into segment objects on the store."""

    def __init__(
        self,
        store: ObjectStore,
        options: WriterOptions | None = None,
        *,
        writer_id: str | None = None,
    ) -> None:
        # defaults, docs and ranges: statelog.options.WriterOptions (checked when it is built)
        options = WriterOptions() if options is None else options
        self.options = options
        self.store = store
        self.writer_id = writer_id or new_writer_id()
        self.persist_delay = options.persist_delay
        self.flush_records = options.flush_records
        self.max_buffered_records = options.max_buffered_records
        self.max_inflight_bytes = options.max_inflight_bytes
        self.coalesce = options.coalesce
        self.encode_in_task = options.encode_in_task
        # columnar buffers for narrow streams (None: COLUMNAR_BUFFERS; needs the extension)
        self.columnar = (COLUMNAR_BUFFERS if options.columnar is None else options.columnar) and HAVE_RECORD_BUFFER
        self.encode_batch_records = max(1, min(options.encode_batch_records, options.max_buffered_records))
        self.retry = options.retry
        self.encoder = BlockEncoder(options.compression_level, options.compression)
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
        self._uploads = cf.ThreadPoolExecutor(options.upload_threads, thread_name_prefix="statelog-upload")
        self._flusher = threading.Thread(target=self._run, name="statelog-flusher", daemon=True)
        self._flusher.start()
        # A writer left open at interpreter exit stops quietly (its unreferenced tail is
        # garbage either way: only published checkpoints make records count). The hook runs
        # with the threading shutdown hooks, before concurrent.futures stops its pools.
        ref = weakref.ref(self)
        threading._register_atexit(lambda: (w := ref()) is not None and w._stop_at_exit())  # type: ignore[attr-defined]

    # -- streams ---------------------------------------------------------------------------

    def open_stream(self, stream_id: str, info: StateInfo, narrow: bool = False) -> ChangelogStream:
        """A new stream for one state; ``narrow`` records carry no user key and no expiry."""
        self._check_usable()
        sid = stream_id
        with self._lock:
            if sid in self._streams:
                raise ConfigError(f"changelog stream {sid!r} is already open in this writer")
            stream = ChangelogStream(self, sid, info, narrow)
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

    def wake(self) -> None:
        """Wake the flusher (a stream's buffer passed ``flush_records``)."""
        self._wake.set()

    def fail(self, exc: BaseException) -> StatelogError:
        """Fail the writer with ``exc`` (a task could not convert its records); the error to raise."""
        self._fail(exc)
        return self._failed_error()

    def _failed_error(self) -> StatelogError:
        if isinstance(self._failure, FencedError):
            return self._failure  # the process lost its root: no restart can help
        return WriterFailedError(
            f"changelog writer {self.writer_id} failed and cannot make changes durable: "
            f"{self._failure}; restart the task from its latest completed checkpoint"
        )

    def wait_writable(self, stream: ChangelogStream) -> None:
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

    def wait_drained(self, stream: ChangelogStream) -> None:
        """Called by a task whose stream holds too many records: wait until the flusher took them."""
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
        converted: list[tuple[ChangelogStream, int, int, list[EncodedBatch]]] = []
        for (s, start, end, encoded), (raw_start, cols, seals) in zip(taken, raw, strict=True):
            batches: list[EncodedBatch] = []
            for chunk_start, _count, payload in encoded:
                if isinstance(payload, tuple):  # columns taken by the task
                    batches.extend(s.encode_chunk(chunk_start, payload[0], payload[1]))
                else:
                    batches.extend(payload)
            if cols is not None:
                batches.extend(s.encode_chunk(raw_start, cols, seals))
            converted.append((s, start, end, batches))
        taken = converted
        with self._lock:
            seg_no = self._next_segment
            self._next_segment += 1
        name = segment_key(self.writer_id, seg_no)
        data, footer = encode_segment(
            self.writer_id,
            seg_no,
            int(time.time() * 1000),
            [StreamChunk(s.stream_id, s.info.name, start, end, batches) for s, start, end, batches in taken],
            self.encoder,
        )
        spans = list(footer.streams)
        with self._cond:
            self._inflight_bytes += len(data)
            self._update_throttle_locked()
        fut = self._uploads.submit(
            call_with_retry, self.retry, lambda: self.store.put(name, data), f"upload of {name}"
        )
        fut.add_done_callback(lambda f: self._uploaded(f, name, len(data), taken, spans))

    def _uploaded(
        self,
        fut: cf.Future[None],
        name: str,
        size: int,
        taken: list[tuple[ChangelogStream, int, int, list[EncodedBatch]]],
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

