"""The process-wide changelog writer: streams, durability, failure.

Every state of every keyed backend in a process appends its change records to its own
:class:`~statelog.changelog.stream.ChangelogStream` (one per state and subtask attempt);
one :class:`ChangelogWriter` per process and job root collects the buffered records of
*all* streams and uploads them as one segment object per flush, so the number of objects
stays low however many subtasks and states a process runs. A flush happens when the persist
delay has passed (default 250 ms), when the buffered records exceed a threshold, or at once
when a checkpoint asks for durability. How tasks append and convert their records is
described in :mod:`statelog.changelog.stream`.

The writer owns the streams, their durability (:meth:`ChangelogWriter.persist`: a future per
checkpoint, resolved in sequence order as segments are uploaded) and the writer's failure;
the flusher thread that batches records into segments, the store writes and back-pressure
are in :mod:`statelog.changelog.upload`.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import threading
import weakref

from statelog.changelog.encoder import BlockEncoder
from statelog.changelog.stream import HAVE_RECORD_BUFFER, ChangelogStream
from statelog.changelog.upload.scheduler import BatchingUploadScheduler, Segment
from statelog.changelog.upload.throttle import UploadThrottle
from statelog.changelog.upload.uploader import SegmentUploader
from statelog.descriptors import StateInfo
from statelog.errors import ConfigError, FencedError, StatelogError, WriterFailedError
from statelog.layout import new_writer_id
from statelog.options.engine import WriterOptions
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

# Narrow streams buffer their records as columns (RecordBuffer) when the extension is built;
# STATELOG_PURE_PYTHON=1 keeps the flat lists (the reference layout). Read when a writer is
# created; WriterOptions(columnar=...) overrides it.
COLUMNAR_BUFFERS = HAVE_RECORD_BUFFER and os.environ.get("STATELOG_PURE_PYTHON", "") in ("", "0")


class ChangelogWriter:
    """Batches the streams of one process into segment objects on the store.

    Threads: the task threads append and wait here when throttled; the flusher
    (:class:`~statelog.changelog.upload.scheduler.BatchingUploadScheduler`) takes their
    records; the upload threads (:class:`~statelog.changelog.upload.uploader.SegmentUploader`)
    report each segment to :meth:`_uploaded` or :meth:`_fail`. One condition guards the
    streams map, their waiters, the failure and the back-pressure state.
    """

    def __init__(
        self,
        store: ObjectStore,
        options: WriterOptions | None = None,
        *,
        writer_id: str | None = None,
    ) -> None:
        # defaults, docs and ranges: statelog.options.engine.WriterOptions (checked when it is built)
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
        self._failure: BaseException | None = None
        self._closed = False
        self.bytes_uploaded = 0
        self.segments_uploaded = 0
        self._throttle = UploadThrottle(self._cond, self._streams, self.max_inflight_bytes, self.max_buffered_records)
        self.scheduler = BatchingUploadScheduler(
            self.writer_id,
            self._streams,
            options,
            self.encoder,
            self._throttle,
            SegmentUploader(store, self.retry, options.upload_threads),
            on_uploaded=self._uploaded,
            on_failure=self._fail,
        )
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
        self.scheduler.wake()
        return fut

    def flush_soon(self) -> None:
        """Start uploading every buffered record now, without waiting for it.

        A checkpoint is coming (its barriers are on their way): what the flusher takes now is
        durable sooner, and the checkpoint's own flush (:meth:`persist` at the barrier) only
        has the records appended after this call left to upload.
        """
        self.scheduler.flush_soon()

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
        self.scheduler.close()

    def _stop_at_exit(self) -> None:
        if not self._closed:
            self._closed = True
            self.scheduler.stop(timeout=5)

    def _uploaded(self, segment: Segment) -> None:
        """Segment ``segment`` is on the store: records become durable in sequence order."""
        self.bytes_uploaded += segment.size
        self.segments_uploaded += 1
        resolved: list[tuple[cf.Future[int], int]] = []
        with self._lock:
            for s, start, ref in segment.parts:
                with s.lock:
                    for p in s._pending:
                        if p[0] == start:
                            p[2] = ref
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

    # -- the tasks' side (statelog.changelog.stream.StreamSink) -------------------------------

    def wake(self) -> None:
        """Wake the flusher (a stream's buffer passed ``flush_records``)."""
        self.scheduler.wake()

    def wait_writable(self, stream: ChangelogStream) -> None:
        """Called by a throttled task: wait until the flusher lifts back-pressure."""
        self.scheduler.wake()
        with self._cond:
            while True:
                if self._failure is not None:
                    raise self._failed_error()
                if not stream.throttled or stream.closed:
                    return
                if not self._cond.wait(0.05):
                    self._throttle.update_locked()

    def wait_drained(self, stream: ChangelogStream) -> None:
        """Called by a task whose stream holds too many records: wait until the flusher took them."""
        limit = self.max_buffered_records
        self.scheduler.wake()
        with self._cond:
            while stream.buffered >= limit:
                if self._failure is not None:
                    raise self._failed_error()
                if stream.closed:
                    return
                self.scheduler.wake()
                self._cond.wait(0.01)

    # -- failure -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failed_error()
        if self._closed:
            raise StatelogError("the changelog writer is closed")

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

    def _fail(self, exc: BaseException) -> None:
        """Fail the writer for good: every task is throttled and every waiting checkpoint fails."""
        with self._cond:
            if self._failure is None:
                self._failure = exc
            self._throttle.fail_locked()
            waiters = []
            for s in self._streams.values():
                waiters.extend(s._waiters)
                s._waiters.clear()
            self._cond.notify_all()
        err = self._failed_error()
        for _, fut in waiters:
            if not fut.done():
                with contextlib.suppress(cf.InvalidStateError):  # cancelled meanwhile
                    fut.set_exception(err)
