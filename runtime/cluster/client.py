"""The handle of a running job: wait for it, watch its attempts, take savepoints, cancel."""

from __future__ import annotations

import threading
import time

from runtime.cluster.master import JobMaster, JobResult
from statelog.checkpoint.metadata import CheckpointMetadata


class JobClient:
    """Handle of a job running in a background thread of this process."""

    def __init__(self, master: JobMaster) -> None:
        self.master = master
        self._result: JobResult | None = None
        self._exc: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"job-master-{master.name}", daemon=True)

    @staticmethod
    def start(master: JobMaster) -> JobClient:
        client = JobClient(master)
        client._thread.start()
        return client

    def _run(self) -> None:
        try:
            self._result = self.master.run()
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self._exc = e
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> JobResult:
        if not self._done.wait(timeout):
            self.master.cancel()
            self._done.wait(30)
            raise TimeoutError(f"job {self.master.name!r} did not finish within {timeout}s (cancelled)")
        if self._exc is not None:
            raise self._exc
        assert self._result is not None
        return self._result

    def wait_running(self, min_attempt: int = 1, timeout: float | None = None) -> bool:
        """Wait until attempt ``>= min_attempt`` runs (all workers deployed); False on timeout
        or when the job ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        m = self.master
        with m.lock:
            while m.running_attempt < min_attempt:
                if self._done.is_set():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                m.running_changed.wait(0.05 if left is None else min(0.05, left))
            return True

    def worker_pids(self) -> list[int]:
        return self.master.worker_pids()

    @property
    def attempt(self) -> int:
        return self.master.attempt

    @property
    def running_attempt(self) -> int:
        """The attempt whose workers all run, 0 while (re)starting."""
        with self.master.lock:
            return self.master.running_attempt

    @property
    def completed_checkpoints(self) -> list[int]:
        with self.master.lock:
            return list(self.master.completed)

    def cancel(self) -> None:
        self.master.cancel()

    def trigger_savepoint(self, name: str, timeout: float | None = 120.0) -> CheckpointMetadata:
        """Take a checkpoint now and write savepoint ``name`` of it (a self-contained image
        that GC never deletes); returns the savepoint's metadata."""
        return self.master.request_savepoint(name, stop=False).result(timeout)

    def stop_with_savepoint(self, name: str, timeout: float | None = 120.0) -> JobResult:
        """Take savepoint ``name``, then stop the job: the output up to the savepoint is
        committed, a job restored from ``"savepoint:NAME"`` continues exactly once."""
        self.master.request_savepoint(name, stop=True).result(timeout)
        return self.wait(timeout)
