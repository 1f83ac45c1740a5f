"""Running a job's workers on a Spark cluster, as the tasks of one barrier stage.

``env.execute(name, cluster="spark", spark=session)`` gives the job master a
:class:`SparkLauncher`. Per attempt:

1. the job master (in the Spark driver) opens a **control listener**, a TCP socket on the
   driver's host (``spark.driver.host``);
2. a driver thread runs a barrier stage of ``parallelism`` tasks in its own job group
   (``rdd.barrier().mapPartitions(...).collect()``); Spark gang-schedules them, so all
   workers run at once or none does;
3. each task (:func:`run_worker_task`, in the executor's Python worker process) reads its
   index (the partition id) and its host (``BarrierTaskContext.getTaskInfos``), connects to
   the control listener, proves the job secret (:mod:`runtime.network.auth`) and runs a
   :class:`~runtime.worker.process.Worker` over that connection: it reports its channel server's
   address and pid; the job master hands every worker the addresses of all the others
   in the deploy spec, exactly as for local workers;
4. the listener closes once every task is connected.

The control listener's address and the job secret travel in the task's closure (Spark
ships it to the executors with the task); never in a Spark conf, a log or an error.

**Failures and restarts.** A worker that dies (SIGKILL of its Python worker, an exception)
closes its control connection: the job master fails the attempt at once; Spark fails the
barrier stage as well and kills its other tasks. The attempt's teardown closes every
control connection (a worker whose job master is gone exits), cancels the job group and
waits for the stage to end. The job master's restart strategy then starts the next attempt
as a new barrier stage. Spark never retries on its own: a failed barrier *result* stage is
aborted by Spark's DAG scheduler (never resubmitted), and a barrier task failure fails the
whole task set, whatever ``spark.task.maxFailures`` says.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from multiprocessing.connection import Connection
from typing import Any

from runtime.cluster.launcher import Launcher, WorkerProc
from runtime.config import JobConfig
from runtime.errors import JobGraphError, PeerAuthenticationError, WorkerLostError
from runtime.network.auth import handshake
from runtime.worker.process import Worker

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0  # scheduling a barrier stage waits for free slots
STAGE_END_TIMEOUT_S = 60.0
FIRST_MESSAGE_TIMEOUT_S = 30.0


def spark_context(spark: Any) -> Any:
    """The ``SparkContext`` of ``spark`` (a SparkSession or SparkContext; None: the active
    session); PySpark is the ``spark`` extra."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise JobGraphError(
            f"cluster='spark' needs PySpark, which cannot be imported ({e}); install the spark extra: "
            "pip install 'statelog[spark]'"
        ) from None
    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise JobGraphError("cluster='spark' needs a Spark session: pass spark=SparkSession (or a SparkContext)")
    if isinstance(spark, SparkSession):
        return spark.sparkContext
    if isinstance(spark, SparkContext):
        return spark
    raise JobGraphError(f"spark= must be a SparkSession or a SparkContext, got {type(spark).__name__}")


# -- the executor side ---------------------------------------------------------------------------


def run_worker_task(index: int, host: str, control: tuple[str, int], secret: bytes) -> None:
    """Run worker ``index`` in this (executor's Python worker) process until the job master
    stops it; raises when the worker fails (the stage fails with it)."""
    sock = socket.create_connection(control, timeout=30.0)
    try:
        handshake(sock, secret, connected=True)
        sock.settimeout(None)
        conn = Connection(sock.detach())
    finally:
        sock.close()
    worker = Worker(index, conn, secret, host)
    try:
        worker.main()
    except BaseException:
        with contextlib.suppress(Exception):
            worker.send(("failed", index, traceback.format_exc()))
        raise
    finally:
        worker.stopping = True  # the control reader may see the job master close: no exit then
        conn.close()


def _barrier_partition(control: tuple[str, int], secret: bytes) -> Any:
    """The function of the barrier stage's ``mapPartitions`` (its closure holds the secret)."""

    def run(_rows: Any) -> Any:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        index = ctx.partitionId()
        host = ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
        run_worker_task(index, host, control, secret)
        yield index

    return run


# -- the driver side -----------------------------------------------------------------------------


def accept_control(sock: socket.socket, peer: Any, secret: bytes, parallelism: int,
                   connected: set[int]) -> tuple[int, Connection, tuple[str, int], int] | None:
    """Authenticate one accepted control connection, then read its ``ready`` message:
    ``(index, connection, channel server address, pid)``. A peer that fails the handshake
    is closed and logged (None), and nothing it sent is unpickled."""
    try:
        handshake(sock, secret, connected=False)
    except (PeerAuthenticationError, OSError) as e:
        log.warning("refused a control connection from %s: %s", peer, e)
        sock.close()
        return None
    sock.settimeout(None)
    conn = Connection(sock.detach())
    if not conn.poll(FIRST_MESSAGE_TIMEOUT_S):
        log.warning("control connection from %s sent nothing after the handshake; closed", peer)
        conn.close()
        return None
    msg = conn.recv()  # authenticated: a worker of this run
    if msg[0] != "ready" or not 0 <= msg[1] < parallelism or msg[1] in connected:
        conn.close()
        raise WorkerLostError(f"unexpected first message from a barrier task: {msg[:2]!r}")
    _, index, address, pid = msg
    return index, conn, tuple(address), pid


class _SparkTask:
    """A worker's handle: alive while its barrier stage runs (Spark owns the process)."""

    def __init__(self, launcher: SparkLauncher) -> None:
        self._launcher = launcher

    @property
    def exitcode(self) -> int | None:
        return None

    def is_alive(self) -> bool:
        return self._launcher.stage_running()

    def kill(self) -> None:
        pass  # SparkLauncher.finish cancels the stage

    def join(self, timeout: float | None = None) -> None:
        pass


class SparkLauncher(Launcher):
    """Workers as the tasks of a Spark barrier stage (see the module docstring)."""

    def __init__(self, spark: Any, job_name: str) -> None:
        self.sc = spark_context(spark)
        self.job_name = job_name
        self.host = self.sc.getConf().get("spark.driver.host", None) or socket.gethostbyname(socket.gethostname())
        self._thread: threading.Thread | None = None
        self._group = ""
        self._error: str | None = None
        self._done: tuple[int, int] | None = None  # a pipe per attempt: readable once its stage ended

    def stage_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def waitables(self) -> list[Any]:
        return [] if self._done is None else [self._done[0]]

    def failure(self) -> str | None:
        return self._error or "the barrier stage ended before the job master stopped it"

    def _run_stage(self, parallelism: int, control: tuple[str, int], secret: bytes, attempt: int, done: int) -> None:
        try:
            self.sc.setJobGroup(self._group, f"statelog job {self.job_name!r} attempt {attempt}", interruptOnCancel=True)
            rdd = self.sc.parallelize(range(parallelism), parallelism)
            rdd.barrier().mapPartitions(_barrier_partition(control, secret)).collect()
        except Exception as e:  # noqa: BLE001 - reported through failure()
            text = str(e).strip().splitlines()
            self._error = f"{type(e).__name__}: {' '.join(text[:3])[:1000]}"
        finally:
            with contextlib.suppress(OSError):  # closed: the job master stopped waiting
                os.write(done, b"x")

    def start(self, config: JobConfig, secret: bytes, log_level: int | None, attempt: int) -> list[WorkerProc]:
        p = config.parallelism
        self._error = None
        self._done = os.pipe()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        workers: dict[int, WorkerProc] = {}
        try:
            listener.bind((self.host, 0))
            listener.listen(p * 2)
            listener.settimeout(0.5)
            control = listener.getsockname()[:2]
            self._group = f"statelog-{self.job_name}-{attempt}-{uuid.uuid4().hex[:8]}"
            self._thread = threading.Thread(target=self._run_stage, args=(p, control, secret, attempt, self._done[1]),
                                            name=f"spark-stage-{attempt}", daemon=True)  # fmt: skip
            self._thread.start()
            deadline = time.monotonic() + START_TIMEOUT_S
            while len(workers) < p:
                if not self.stage_running():
                    raise WorkerLostError(f"the barrier stage ended before all workers connected: {self.failure()}")
                if time.monotonic() > deadline:
                    raise WorkerLostError(
                        f"{len(workers)} of {p} barrier tasks connected within {START_TIMEOUT_S}s: does the "
                        f"cluster have {p} free task slots at once (spark.cores.max, executor cores)?"
                    )
                try:
                    sock, peer = listener.accept()
                except TimeoutError:
                    continue
                hello = accept_control(sock, peer, secret, p, set(workers))
                if hello is not None:
                    index, conn, address, pid = hello
                    workers[index] = WorkerProc(index, _SparkTask(self), conn, address=address, pid=pid)
        except BaseException:
            for w in workers.values():
                w.conn.close()
            self._cancel()
            raise
        finally:
            listener.close()
        return [workers[i] for i in range(p)]

    def _cancel(self) -> None:
        if self._group:
            with contextlib.suppress(Exception):
                self.sc.cancelJobGroup(self._group)

    def finish(self, workers: list[WorkerProc], kill: bool) -> None:
        """The workers' connections are closed (a worker whose job master is gone exits):
        cancel the job group if the stage still runs, and wait for it to end."""
        if self._thread is None:
            self._close_done()
            return
        if kill:
            self._cancel()
        self._thread.join(STAGE_END_TIMEOUT_S)
        if self._thread.is_alive():
            self._cancel()
            self._thread.join(STAGE_END_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("the barrier stage of job group %s did not end within %.0fs", self._group,
                            2 * STAGE_END_TIMEOUT_S)  # fmt: skip
                self._thread, self._done = None, None  # its thread still writes to the pipe at its end: not closed
                return
        self._thread = None
        self._close_done()

    def _close_done(self) -> None:
        if self._done is not None:
            for fd in self._done:
                os.close(fd)
            self._done = None
