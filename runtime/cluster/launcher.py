"""Launchers: how the job master starts the workers of one attempt and tears them down.

* :class:`LocalLauncher` (the default): ``parallelism`` worker processes on this machine,
  started from the runtime's own entry point (:mod:`runtime.worker.start`: forked by the
  runtime's fork server, or ``spawn``: a fresh interpreter each), never from the user's
  main module; the control connection of each is an unnamed socket pair nobody else can
  reach, and the job secret travels over a socket, never in the process arguments.
* :class:`runtime.cluster.spark.SparkLauncher`: the workers run as the tasks of a Spark
  barrier stage; their control connections are authenticated TCP connections.

Either way the job master talks to every worker over a :class:`WorkerProc`'s ``conn`` with
the protocol of :mod:`runtime.worker.process`, and a worker's ``handle`` tells whether it lives.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from runtime.config import JobConfig
from runtime.worker.start import ForkServer, spawn_worker

log = logging.getLogger(__name__)


class WorkerHandle(Protocol):
    """A worker's process as far as the job master sees it (for local workers
    :class:`runtime.worker.start.ForkedWorker` or :class:`runtime.worker.start.SpawnedWorker`)."""

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


@dataclass(repr=False)
class WorkerProc:
    index: int
    proc: WorkerHandle
    conn: Connection
    address: tuple[str, int] | None = None
    pid: int | None = None
    running: bool = False
    stopped: bool = False
    # a waitable object (fd) ready once the worker's process ended (None: the launcher's
    # own waitables tell, see Launcher.waitables)
    sentinel: Any = None

    def __repr__(self) -> str:
        return f"WorkerProc(index={self.index}, pid={self.pid}, address={self.address})"


class Launcher:
    """Starts and stops the workers of one attempt (see the module docstring)."""

    def start(self, config: JobConfig, secret: bytes, log_level: int | None, attempt: int) -> list[WorkerProc]:
        raise NotImplementedError

    def waitables(self) -> list[Any]:
        """Objects for ``multiprocessing.connection.wait`` whose readiness means the attempt
        failed on the launcher's side (:meth:`failure` says why)."""
        return []

    def failure(self) -> str | None:
        return None

    def finish(self, workers: list[WorkerProc], kill: bool) -> None:
        """After the job master stopped (or killed) the workers and closed their connections."""


# this process's fork server, shared by its jobs (started on the first forkserver attempt)
FORK_SERVER = ForkServer()


class LocalLauncher(Launcher):
    def start(self, config: JobConfig, secret: bytes, log_level: int | None, attempt: int) -> list[WorkerProc]:
        workers = []
        for i in range(config.parallelism):
            if config.start_method == "forkserver":
                handle, conn = FORK_SERVER.start(i, log_level, secret)
            else:
                handle, conn = spawn_worker(i, log_level, secret)
            workers.append(WorkerProc(i, handle, conn, sentinel=handle.sentinel))
        return workers
