"""The flusher of a changelog writer: batches the buffered records of all streams into segments.

One thread per writer (``statelog-flusher``) decides when to flush: at once when woken (a
checkpoint waits in ``persist``, ``flush_soon``, a task's buffer passed ``flush_records``),
when the persist delay has passed, or when the streams together buffer ``flush_records``
records. A flush waits while the uploads in flight hold the cap
(:class:`~statelog.changelog.upload.throttle.UploadThrottle`), takes what every stream
buffered, converts the rest of it to Arrow, encodes one segment object
(:func:`~statelog.changelog.segment.encode_segment`) and hands it to the
:class:`~statelog.changelog.upload.uploader.SegmentUploader`. The writer learns of each
segment's outcome through the ``on_uploaded`` and ``on_failure`` callbacks.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from statelog.changelog.encoder import BlockEncoder, EncodedBatch
from statelog.changelog.segment import StreamChunk, encode_segment
from statelog.changelog.segment_ref import SegmentRef
from statelog.changelog.stream import ChangelogStream
from statelog.changelog.upload.throttle import UploadThrottle
from statelog.changelog.upload.uploader import SegmentUploader
from statelog.layout import segment_key
from statelog.options.engine import WriterOptions

log = logging.getLogger(__name__)

# A busy task converts its own records; the flusher converts a partial batch only after
# the task has not completed one for this many persist delays (a slow stream).
RAW_TAKE_DELAYS = 3
# The flusher's longest sleep between two looks at the buffers (see BatchingUploadScheduler._run).
POLL_S = 0.05


@dataclass(frozen=True)
class Segment:
    """One uploaded segment object: ``parts`` are the ranges of the streams it holds, each as
    ``(stream, start of the range, reference to record once the object is durable)``."""

    name: str
    size: int
    parts: list[tuple[ChangelogStream, int, SegmentRef]]


# what a flush took of one stream: (stream, start, end, batches converted by the task) and
# the raw rest: (its first sequence number, its columns or None, sealed positions in it)
_Taken = tuple[ChangelogStream, int, int, list[tuple[int, int, Any]]]
_Raw = tuple[int, Any, list[int]]


class BatchingUploadScheduler:
    """Runs the flusher thread of one writer and submits one segment per flush.

    ``streams`` is the writer's live map of open streams, guarded by ``throttle.cond``.
    """

    def __init__(
        self,
        writer_id: str,
        streams: Mapping[str, ChangelogStream],
        options: WriterOptions,
        encoder: BlockEncoder,
        throttle: UploadThrottle,
        uploader: SegmentUploader,
        on_uploaded: Callable[[Segment], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.writer_id = writer_id
        self._streams = streams
        self.persist_delay = options.persist_delay
        self.flush_records = options.flush_records
        self.encode_in_task = options.encode_in_task
        self.split_rows = (options.split_min_rows, options.split_block_rows)
        self.encoder = encoder
        self.throttle = throttle
        self._cond = throttle.cond
        self.uploader = uploader
        self._on_uploaded = on_uploaded
        self._on_failure = on_failure
        self._wake = threading.Event()
        self._take_all = False  # flush_soon: the next flush takes the partial batches too
        self._next_segment = 0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="statelog-flusher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Wake the flusher: it looks at the buffers now."""
        self._wake.set()

    def flush_soon(self) -> None:
        """The next flush takes every buffered record, partial batches included; wake the flusher."""
        self._take_all = True
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the flusher thread (uploads in flight go on)."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=timeout)

    def close(self) -> None:
        """Stop the flusher and wait for the uploads in flight."""
        self.stop(timeout=10)
        self.uploader.close()

    def _run(self) -> None:
        # Checkpoints (persist), close and a task whose buffer passed flush_records wake the
        # flusher at once; the poll only bounds how late the persist delay and the record
        # threshold of streams appending through slow paths are noticed. Every wake-up takes
        # the GIL from the task threads, so it is rare.
        poll = min(self.persist_delay, POLL_S) if self.persist_delay > 0 else 0.001
        last = time.monotonic()
        while not self._stopped:
            self._wake.wait(poll)
            woken = self._wake.is_set()
            if woken:
                self._wake.clear()
            now = time.monotonic()
            buffered = 0
            self.throttle.update()
            for s in list(self._streams.values()):
                n = s.buffered
                buffered += n
                if n and s._waiters:  # a checkpoint waits for records not yet taken
                    woken = True
            if not (woken or now - last >= self.persist_delay or buffered >= self.flush_records):
                continue
            last = now
            try:
                self.flush_once()
            except BaseException as e:  # noqa: BLE001 - the writer must fail loudly, not die silently
                log.exception("changelog writer %s: flush failed", self.writer_id)
                self._on_failure(e)
                return

    def flush_once(self) -> None:
        """One flush: take what the streams buffered and submit it as one segment (if any)."""
        if self.throttle.failed:
            return
        self.throttle.wait_for_capacity()
        taken, raw = self._take()
        if not taken:
            return
        with self._cond:
            self._cond.notify_all()  # tasks waiting for their buffer to drain
        chunks = self._convert(taken, raw)
        with self._cond:
            seg_no = self._next_segment
            self._next_segment += 1
        name = segment_key(self.writer_id, seg_no)
        data, footer = encode_segment(self.writer_id, seg_no, int(time.time() * 1000), chunks, self.encoder,
                                      *self.split_rows)
        size = len(data)
        segment = Segment(
            name,
            size,
            [
                (s, start, SegmentRef(name, size, span.start, span.end, span.bytes))
                for (s, start, _end, _encoded), span in zip(taken, footer.streams, strict=True)
            ],
        )
        self.throttle.seize(size)
        fut = self.uploader.upload(name, data)
        fut.add_done_callback(lambda f: self._done(f, segment))

    def _take(self) -> tuple[list[_Taken], list[_Raw]]:
        """Take the records of every stream that has some to ship (each under its own lock)."""
        taken: list[_Taken] = []
        raw: list[_Raw] = []
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
        return taken, raw

    def _convert(self, taken: list[_Taken], raw: list[_Raw]) -> list[StreamChunk]:
        """The segment's chunks: what the tasks converted, then the raw rest converted here."""
        chunks: list[StreamChunk] = []
        for (s, start, end, encoded), (raw_start, cols, seals) in zip(taken, raw, strict=True):
            batches: list[EncodedBatch] = []
            for chunk_start, _count, payload in encoded:
                if isinstance(payload, tuple):  # columns taken by the task
                    batches.extend(s.encode_chunk(chunk_start, payload[0], payload[1]))
                else:
                    batches.extend(payload)
            if cols is not None:
                batches.extend(s.encode_chunk(raw_start, cols, seals))
            chunks.append(StreamChunk(s.stream_id, s.info.name, start, end, batches))
        return chunks

    def _done(self, fut: cf.Future[None], segment: Segment) -> None:
        exc = fut.exception()
        self.throttle.release(segment.size)
        if exc is not None:
            log.error("changelog writer %s: upload of %s failed: %s", self.writer_id, segment.name, exc)
            self._on_failure(exc)
            return
        self._on_uploaded(segment)
