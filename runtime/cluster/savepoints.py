"""Savepoints taken while a job runs, on a client's request.

A request asks the coordinator for a checkpoint soon; the first checkpoint that completes
after the request (id ``>= min_id``) is the savepoint's: a thread writes the savepoint of it
(:func:`materializer.savepoint.create_savepoint`) and completes the request's future. A
stop-with-savepoint request suspends the coordinator from its checkpoint on (nothing may
commit after it) and stops the job once the savepoint exists; if writing it failed, the
job keeps running.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass

from materializer.savepoint import create_savepoint
from runtime.cluster.coordinator import CheckpointCoordinator
from runtime.errors import RuntimeJobError
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.layout import check_savepoint_name
from statelog.store import reopen_store
from statelog.store.base import ObjectStore


@dataclass
class SavepointRequest:
    name: str
    stop: bool
    future: Future[CheckpointMetadata]
    min_id: int | None = None  # the first checkpoint id the savepoint may be taken of
    started: bool = False
    checkpoint_id: int | None = None


class Savepoints:
    """The savepoint requests of one job run (clients add them from their threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[SavepointRequest] = []
        self.stopped_with: SavepointRequest | None = None  # set when the job stops with a savepoint

    def request(self, name: str, stop: bool) -> Future[CheckpointMetadata]:
        req = SavepointRequest(check_savepoint_name(name), stop, Future())
        with self._lock:
            self._requests.append(req)
        return req.future

    def stopping(self) -> bool:
        """A stop-with-savepoint request has its checkpoint already (an attempt starting now
        keeps the coordinator suspended)."""
        with self._lock:
            return any(r.stop and r.started for r in self._requests)

    def service(self, coordinator: CheckpointCoordinator) -> bool:
        """Ask for checkpoints for new requests; True when the job stops with a savepoint."""
        with self._lock:
            reqs = list(self._requests)
        for req in reqs:
            if req.min_id is None:
                req.min_id = coordinator.next_id
                coordinator.trigger_soon()
            if req.future.done():
                with self._lock:
                    self._requests.remove(req)
                if req.stop:
                    if req.future.exception() is None:
                        self.stopped_with = req
                        return True
                    coordinator.suspended = False  # the savepoint failed: keep running
        return False

    def on_complete(self, checkpoint_id: int, coordinator: CheckpointCoordinator, store: ObjectStore) -> None:
        """Checkpoint ``checkpoint_id`` completed: start the savepoints that wait for it."""
        with self._lock:
            reqs = [r for r in self._requests if not r.started and r.min_id is not None and checkpoint_id >= r.min_id]
        for req in reqs:
            self._start(req, checkpoint_id, coordinator, store)

    def _start(self, req: SavepointRequest, cid: int, coordinator: CheckpointCoordinator, store: ObjectStore) -> None:
        req.started, req.checkpoint_id = True, cid
        if req.stop:
            coordinator.suspended = True  # nothing may commit after the savepoint's checkpoint

        def run() -> None:
            try:
                # a handle fenced like the job's: a process that lost the root writes no savepoint
                own = reopen_store(store)
                try:
                    req.future.set_result(create_savepoint(own or store, cid, req.name))
                finally:
                    if own is not None:
                        own.close()
            except BaseException as e:  # noqa: BLE001 - reported through the future
                req.future.set_exception(e)

        threading.Thread(target=run, name=f"savepoint-{req.name}", daemon=True).start()

    def fail_left(self, job_name: str) -> None:
        """The job ended: the requests not started fail (a started one finishes by itself)."""
        with self._lock:
            left, self._requests = self._requests, []
        for req in left:
            if not req.started and not req.future.done():
                req.future.set_exception(RuntimeJobError(f"job {job_name!r} ended before savepoint {req.name!r}"))
