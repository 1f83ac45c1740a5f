"""Launchers: how the job master starts the workers of one attempt and tears them down.

* :class:`LocalLauncher` (the default): ``parallelism`` worker processes on this machine
  (``multiprocessing``, ``forkserver`` with the runtime preloaded, or ``spawn``); the
  control connection of each is a ``multiprocessing`` pipe (an unnamed socket pair nobody
  else can reach); the job secret travels in the process arguments.
* :class:`runtime.cluster.spark.SparkLauncher`: the workers run as the tasks of a Spark
  barrier stage; their control connections are authenticated TCP connections.

Either way the job master talks to every worker over a :class:`WorkerProc`'s ``conn`` with
the protocol of :mod:`runtime.worker.process`, and a worker's ``handle`` tells whether it lives.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from runtime.config import JobConfig
from runtime.worker.process import worker_main

log = logging.getLogger(__name__)


class WorkerHandle(Protocol):
    """A worker's process as far as the job master sees it (a ``multiprocessing.Process``
    for local workers)."""

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


class LocalLauncher(Launcher):
    def start(self, config: JobConfig, secret: bytes, log_level: int | None, attempt: int) -> list[WorkerProc]:
        ctx = mp.get_context(config.start_method)
        if config.start_method == "forkserver":
            ctx.set_forkserver_preload(["runtime.worker.process"])
        workers = []
        for i in range(config.parallelism):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(i, child, log_level, secret), daemon=True,
                               name=f"statelog-worker-{i}")  # fmt: skip
            proc.start()
            child.close()
            workers.append(WorkerProc(i, proc, parent, sentinel=proc.sentinel))
        return workers
