"""The job master's end of its workers' control connections: the messages of
:mod:`runtime.worker.process`, the workers' write grant, and stopping the workers.

:class:`WorkerControl` is the part of :class:`~runtime.cluster.master.JobMaster` that talks
to the workers of the running attempt: it polls their connections (and process sentinels,
and the launcher's own waitables), turns every message into the master's state (the
coordinator's acknowledgements, committables, finished sources, restore figures) and turns
a worker's death or failure report into the exception that fails the attempt.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from runtime.cluster.coordinator import CheckpointCoordinator
from runtime.cluster.launcher import Launcher, WorkerProc
from runtime.cluster.metrics import JobMetrics
from runtime.config import JobConfig
from runtime.errors import TaskFailedError, WorkerLostError
from statelog.job import StateJob

log = logging.getLogger(__name__)

COPY_COUNTS = frozenset({"objects_local", "objects_remote", "bytes_local", "bytes_remote", "copies_dropped"})

STOP_TIMEOUT_S = 20.0
# a worker's channel error names a dead peer as the cause if one is seen dead within this long
PEER_DEATH_GRACE_S = 1.0


class WorkerControl:
    """The job master's methods about its workers (the master sets the attributes below)."""

    config: JobConfig
    job: StateJob
    launcher: Launcher
    metrics: JobMetrics
    coordinator: CheckpointCoordinator
    lock: threading.Lock
    running_changed: threading.Condition
    workers: list[WorkerProc]
    attempt: int
    running_attempt: int
    source_task_keys: set[str]
    restore_stats: dict[int, dict[str, Any]]
    collected: dict[str, list[Any]]  # per collecting sink uid: its records of completed checkpoints
    _uncommitted: list[tuple[int, str, list[Any]]]  # (checkpoint id, sink uid, records) until it completes
    _finished: set[str]  # the source tasks that finished in this attempt
    _fenced_event: threading.Event
    _granted: float

    def _broadcast(self, msg: tuple[Any, ...]) -> None:
        for w in self.workers:
            try:
                w.conn.send(msg)
            except OSError as e:
                raise WorkerLostError(f"worker {w.index} (pid {w.pid}) is unreachable: {e}") from None

    def _poll(self, timeout: float) -> None:
        if self._fenced_event.is_set() and self.job.fenced is not None:
            raise self.job.fenced
        self._grant_writes()
        by_obj: dict[Any, tuple[str, WorkerProc | None]] = {}
        for w in self.workers:
            by_obj[w.conn] = ("conn", w)
            if w.sentinel is not None:
                by_obj[w.sentinel] = ("exit", w)
        for obj in self.launcher.waitables():
            by_obj[obj] = ("launcher", None)
        ready = wait(list(by_obj), max(0.0, timeout))
        # messages first: a failing worker's report comes before its exit
        for obj in sorted(ready, key=lambda o: by_obj[o][0] != "conn"):
            kind, w = by_obj[obj]
            if w is None:
                for other in self.workers:  # a worker's own report or death names the cause best
                    self._drain(other)
                raise WorkerLostError(f"the workers' cluster side failed: {self.launcher.failure()}")
            if kind == "conn":
                self._drain(w)
            else:
                self._drain(w)
                if not w.stopped:
                    w.proc.join(0.1)
                    raise WorkerLostError(
                        f"worker {w.index} (pid {w.pid}) exited with code {w.proc.exitcode}"
                    )

    def _grant_writes(self) -> None:
        """Send the workers the lease's new deadline when it moved (runtime/worker/lease_grant.py)."""
        valid_until = self.job.writer_lease_valid_until()
        if valid_until is None or valid_until <= self._granted + 0.05:
            return
        self._granted = valid_until
        for w in self.workers:
            if w.running:  # deployed: the deploy message carried the grant until then
                with contextlib.suppress(OSError):  # a dead worker is noticed by the poll
                    w.conn.send(("lease", valid_until))

    def _drain(self, w: WorkerProc) -> None:
        try:
            while w.conn.poll():
                self._on_message(w, w.conn.recv())
        except (EOFError, OSError):
            if not w.stopped:
                raise WorkerLostError(f"worker {w.index} (pid {w.pid}) closed its connection") from None

    def _on_message(self, w: WorkerProc, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ack":
            _, cid, task, handles, sources, stats = msg
            self.metrics.observe_task(task, stats)
            self.coordinator.ack(cid, task, handles, sources, stats)
        elif kind == "committables":
            _, cid, _task, by_uid = msg
            for uid, records in by_uid.items():
                self._uncommitted.append((cid, uid, records))
        elif kind == "decline":
            _, cid, task, reason = msg
            self.coordinator.decline(cid, task, reason)
        elif kind == "source_finished":
            self._finished.add(msg[1])
            if self._finished >= self.source_task_keys and self.running_attempt == self.attempt:
                self.coordinator.request_final()
        elif kind == "ready":
            _, _i, address, pid = msg
            with self.lock:
                w.address, w.pid = tuple(address), pid
        elif kind == "running":
            w.running = True
        elif kind == "failed":
            if str(msg[2]).startswith("ChannelError"):  # usually secondary: name the dead worker
                dead = self._dead_peer(w)
                if dead is not None:
                    raise WorkerLostError(f"worker {dead.index} (pid {dead.pid}) exited with code {dead.proc.exitcode}")
            raise TaskFailedError(f"worker {w.index} (pid {w.pid}) failed:\n{msg[2]}")
        elif kind == "restored":
            stats = self.restore_stats.setdefault(self.attempt, {"workers": 0, "on_demand": self.config.on_demand_restore})
            stats["workers"] += 1
            for k, v in msg[2].items():  # times: the slowest worker's; local copies: summed
                stats[k] = stats.get(k, 0) + v if k in COPY_COUNTS else max(stats.get(k, 0.0), v)
        elif kind == "stopped":
            w.stopped = True
        else:
            log.warning("unknown message from worker %d: %r", w.index, kind)

    def _collect_committed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: the records the workers' collecting sinks
        sent for it and the checkpoints before it are the job's result."""
        keep = []
        for entry in self._uncommitted:
            if entry[0] <= checkpoint_id:
                self.collected.setdefault(entry[1], []).extend(entry[2])
            else:
                keep.append(entry)
        self._uncommitted = keep

    def _dead_peer(self, w: WorkerProc) -> WorkerProc | None:
        """A worker other than ``w`` seen dead within ``PEER_DEATH_GRACE_S`` (a forkserver
        child's exit reaches its Popen only after the forkserver reaped it), or None."""
        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        while True:
            dead = next((o for o in self.workers if o is not w and not o.proc.is_alive()), None)
            if dead is not None or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def _teardown(self, kill: bool) -> None:
        workers = self.workers
        if not kill:
            for w in workers:
                with contextlib.suppress(OSError):
                    w.conn.send(("stop",))
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while any(not w.stopped and w.proc.is_alive() for w in workers) and time.monotonic() < deadline:
                for w in workers:
                    try:
                        while not w.stopped and w.conn.poll(0.01):
                            msg = w.conn.recv()
                            if msg[0] == "stopped":
                                w.stopped = True
                    except (EOFError, OSError):
                        w.stopped = True
        for w in workers:
            if w.proc.is_alive() and (kill or not w.stopped):
                w.proc.kill()
        for w in workers:
            w.proc.join(5.0)
            w.conn.close()
        self.launcher.finish(workers, kill)
        with self.lock:
            self.workers = []
            self.running_attempt = 0
            self.running_changed.notify_all()
