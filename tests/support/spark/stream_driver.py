"""The driver program of ``test_stream_cluster.py``: the clicks job on a standalone cluster.

``python -m tests.support.spark.stream_driver ARGS.json`` reads ``{master, root, out, per_split, rate,
parallelism, result}``, runs the clicks job of :mod:`tests.support.jobs` with
``cluster="spark"`` against the master (the S3 settings only in this process's ``AWS_*``
environment), SIGKILLs the Python process of one barrier task once a checkpoint completed,
and writes what happened to ``result`` (JSON): attempts, failures, the killed process's
command line, the worker pids of each attempt.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXECUTORS_TIMEOUT_S = 120.0


def _running(pid: int) -> bool:
    """Whether process ``pid`` is alive (a zombie, exited but not reaped yet, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_for_executors(sc: Any, n: int) -> None:
    """Barrier stages need all their slots at once: wait until ``n`` executors registered."""
    deadline = time.monotonic() + EXECUTORS_TIMEOUT_S
    while len(sc.statusTracker().getExecutorInfos()) < n + 1:  # the driver is listed too
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} executors registered within {EXECUTORS_TIMEOUT_S}s")
        time.sleep(0.5)


def main(args_path: str) -> None:
    from pyspark.sql import SparkSession

    from runtime import FixedDelay, StreamExecutionEnvironment
    from tests.support import jobs

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = json.loads(Path(args_path).read_text())
    p = args["parallelism"]
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "2",
        "spark.cores.max": str(p),
        "spark.task.maxFailures": "1",
        "spark.python.task.killTimeout": "1s",
        "spark.executorEnv.PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    builder = SparkSession.builder.master(args["master"]).appName("statelog-stream-cluster-test")
    for k, v in conf.items():
        builder = builder.config(k, v)
    t_session = time.monotonic()
    spark = builder.getOrCreate()
    out: dict[str, Any] = {"pids": {}, "t": {}}
    t0 = time.monotonic()

    def mark(what: str) -> None:
        out["t"][what] = round(time.monotonic() - t0, 2)

    try:
        out["t"]["session"] = round(t0 - t_session, 2)
        _wait_for_executors(spark.sparkContext, max(1, p // 2))  # 2 cores each
        mark("executors")
        env = StreamExecutionEnvironment(
            parallelism=p, checkpoint_interval_s=0.5, state_root=args["root"],
            restart_strategy=FixedDelay(attempts=3, delay_s=0.5),
        )
        jobs.build_clicks(env, Path(args["out"]), args["per_split"], rate=args["rate"])
        client = env.execute_async("clicks-on-spark", cluster="spark", spark=spark)
        if not client.wait_running(1, timeout=240):
            raise RuntimeError(f"attempt 1 did not run: {client.master.failures}")
        out["pids"][1] = client.worker_pids()
        mark("running-1")
        deadline = time.monotonic() + 120
        while not client.completed_checkpoints and time.monotonic() < deadline:
            time.sleep(0.1)
        if not client.completed_checkpoints:
            raise RuntimeError("no checkpoint completed within 120 s")
        if args.get("fence"):
            _fence(client, spark, args, out)
            return
        victim = out["pids"][1][1]
        out["killed_cmdline"] = Path(f"/proc/{victim}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        out["killed_after_checkpoints"] = len(client.completed_checkpoints)
        os.kill(victim, signal.SIGKILL)
        out["killed"] = victim
        mark("killed")
        if client.wait_running(2, timeout=240):
            out["pids"][2] = client.worker_pids()
            mark("running-2")
        result = client.wait(600)
        mark("done")
        out.update(attempts=result.attempts, failures=result.failures,
                   completed=len(result.completed_checkpoints), duration_s=result.duration_s)
    finally:
        spark.stop()
        Path(args["result"]).write_text(json.dumps(out))


def _fence(client: Any, spark: Any, args: dict[str, Any], out: dict[str, Any]) -> None:
    """Another copy takes the root's writer lease over (as after a stall of this driver longer
    than the ttl): the job must end with FencedError in its first attempt, and its barrier
    stage must end with it."""
    from statelog.checkpoint.lease_objects import current_holder
    from statelog.checkpoint.writer_lease import WriterLease
    from statelog.errors import FencedError
    from statelog.layout import WRITER_LEASE_PREFIX
    from statelog.store import open_store

    store = open_store(args["root"])
    try:
        other = WriterLease(store, owner="the other copy", holder_is_dead=lambda body: True)
        out["taken_generation"] = other.acquire()
        t = time.monotonic()
        try:
            client.wait(120)
            out["error"] = None
        except FencedError as e:
            out["error"] = str(e)
        out["ended_after_s"] = round(time.monotonic() - t, 2)
        out["attempts"] = client.attempt
        tracker = spark.sparkContext.statusTracker()
        out["active_jobs"] = list(tracker.getActiveJobsIds())
        # the barrier stage's workers exit once the stage is cancelled: wait for it (an event, not a bound)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_running(p) for p in out["pids"][1]):
            time.sleep(0.1)
        out["workers_alive"] = [p for p in out["pids"][1] if _running(p)]
        out["holder"] = current_holder(store, WRITER_LEASE_PREFIX)
        other.release()
    finally:
        store.close()


if __name__ == "__main__":
    main(sys.argv[1])
