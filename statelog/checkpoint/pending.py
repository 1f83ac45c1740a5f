"""Checkpoints that complete in the background (``StateJob.checkpoint_async``).

A consumer loop's :meth:`statelog.job.StateJob.checkpoint` blocks until the checkpoint is
published: the synchronous part (sealing every stream at the given source positions) takes
well under a millisecond, but waiting until the sealed changes are durable takes as long as
the changelog's flusher needs to encode and upload what it still holds (100-150 ms per
checkpoint for a task folding 2-3 M updates/s). ``checkpoint_async`` returns after the
synchronous part, as Flink's asynchronous checkpoint phase does: a thread waits for
durability and publishes the metadata (:class:`PendingCheckpoint`), while the loop goes on.

At most one checkpoint is in flight (Flink's default ``max-concurrent-checkpoints`` of 1):
the next checkpoint of the job, synchronous or not, first waits for it, so checkpoints are
published in id order and a materialization is adopted between them only. A failure of the
background part is raised by :meth:`PendingCheckpoint.result`; if nobody asked for it, by the
next checkpoint call, so no failed checkpoint goes unnoticed. A checkpoint is complete only
once published: act on it (commit source offsets, acknowledge input) in a done callback or
after ``result()``, never right after ``checkpoint_async`` returns.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from statelog.errors import StatelogError

if TYPE_CHECKING:
    from statelog.changelog.writer import ChangelogWriter
    from statelog.checkpoint.metadata import CheckpointMetadata
    from statelog.checkpoint.publish import CheckpointPublisher
    from statelog.state.backend import KeyedStateBackend

log = logging.getLogger(__name__)

CLOSE_CANCEL_JOIN_S = 5.0  # how long close(flush=False) waits for a cancelled checkpoint's thread


class PendingCheckpoint:
    """A checkpoint whose synchronous part is done and whose publication runs in the background."""

    def __init__(self, checkpoint_id: int, complete: Callable[[], CheckpointMetadata], cancel: Callable[[], None]) -> None:
        self.checkpoint_id = checkpoint_id
        self._future: cf.Future[CheckpointMetadata] = cf.Future()
        self._cancel = cancel
        self.observed = False  # whether a caller asked for the outcome
        self._thread = threading.Thread(
            target=self._run, args=(complete,), name=f"statelog-checkpoint-{checkpoint_id}", daemon=True
        )
        self._thread.start()

    def _run(self, complete: Callable[[], CheckpointMetadata]) -> None:
        try:
            self._future.set_result(complete())
        except BaseException as e:  # handed to the caller by result()
            self._future.set_exception(e)

    def done(self) -> bool:
        """Whether it was published or failed."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> CheckpointMetadata:
        """Wait until it is published: its metadata, or the error that failed it."""
        self.observed = True
        try:
            return self._future.result(timeout)
        except cf.TimeoutError:
            raise TimeoutError(f"checkpoint {self.checkpoint_id} was not published within {timeout}s") from None

    def add_done_callback(self, fn: Callable[[PendingCheckpoint], object]) -> None:
        """Call ``fn(self)`` once it is published or failed (at once if it is already), on the
        thread that completed it; ``fn`` calls :meth:`result` to tell which."""
        self._future.add_done_callback(lambda _f: fn(self))

    def wait(self, timeout: float | None) -> bool:
        """Wait until it is done, without taking its outcome; ``False`` on timeout."""
        try:
            self._future.exception(timeout)
        except cf.TimeoutError:
            return False
        return True

    def error(self) -> BaseException | None:
        """Its failure (once done), ``None`` if it was published."""
        return self._future.exception(0) if self._future.done() else None

    def cancel(self) -> None:
        """Stop waiting for durability (the job closes without flushing); joins the thread briefly."""
        self._cancel()
        self._thread.join(CLOSE_CANCEL_JOIN_S)

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self.error() is not None else "published"
        return f"PendingCheckpoint(checkpoint_id={self.checkpoint_id}, {state})"


class InflightCheckpoint:
    """The job's checkpoint in flight, if any: started, awaited by the next checkpoint, and
    finished or cancelled when the job closes."""

    def __init__(self) -> None:
        self.pending: PendingCheckpoint | None = None

    def wait_previous(self, timeout: float) -> None:
        """Wait for the checkpoint in flight; raise its failure if nobody saw it."""
        p = self.pending
        if p is None:
            return
        if not p.wait(timeout + 30.0):  # its own durability wait is bounded by its timeout
            raise StatelogError(
                f"checkpoint {p.checkpoint_id} is still completing in the background; retry the checkpoint later"
            )
        self.pending = None
        err = p.error()
        if err is not None and not p.observed:
            p.observed = True
            raise StatelogError(f"checkpoint {p.checkpoint_id} failed in the background: {err}") from err

    def start(
        self,
        publisher: CheckpointPublisher,
        backends: list[KeyedStateBackend],
        sources: Mapping[str, Any],
        timeout: float,
        before_snapshot: Callable[[], object],
        writer: ChangelogWriter | None,
        retain: int,
        metrics: Any,
    ) -> PendingCheckpoint:
        """Take the synchronous part now; wait for durability and publish on a thread."""
        self.wait_previous(timeout)
        try:
            started = publisher.begin(backends, sources, before_snapshot)
        except BaseException:
            metrics.checkpoint_failed()
            raise

        def complete() -> CheckpointMetadata:
            try:
                meta = publisher.complete(started, backends, sources, timeout, writer, retain)
            except BaseException:
                metrics.checkpoint_failed()
                raise
            metrics.checkpoint_completed(meta, time.monotonic() - started.t0)
            return meta

        def cancel() -> None:
            for s in started.pending:
                s.cancel()

        self.pending = PendingCheckpoint(started.checkpoint_id, complete, cancel)
        return self.pending

    def close(self, flush: bool) -> None:
        """Let the checkpoint in flight publish (``flush``), else cancel it; never raises."""
        p, self.pending = self.pending, None
        if p is None:
            return
        if not flush:
            p.cancel()
            return
        p.wait(None)
        err = p.error()
        if err is not None and not p.observed:
            log.warning("checkpoint %d failed in the background: %s", p.checkpoint_id, err)


__all__ = ["InflightCheckpoint", "PendingCheckpoint"]
