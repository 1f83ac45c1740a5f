"""Spark benchmark: SQL scan throughput of a state and the restore job against a local restore.

* Setup: operator ``bench`` at parallelism 2 keeps a ``ValueState<int64>`` for ``KEYS``
  int keys (10^6); checkpoint 1 is materialized, then 1 % of the keys change and checkpoint
  2 (the materialization plus a changelog tail) is the one measured.
* ``sql_rows_per_s``: a full scan of the state through ``format("statelog")`` (``keyType``
  int64, all rows converted and handed to Spark; ``write.format("noop")`` forces every row
  without collecting it to the driver), rows / median seconds over ``ROUNDS``. Also with
  the untyped key (string rendering plus ``key_bytes``).
* ``restore_job_s``: ``statelog.spark.rescale.driver.restore`` of checkpoint 2 at parallelism 4
  (Spark job: restore each new subtask's key groups and write them as a savepoint),
  median over rounds; ``local_restore_s``: restoring the same checkpoint for the same 4
  subtasks in this process with ``job.backend(..., restore=2)`` (reads the materialized
  tables and replays the tail into memory, one subtask after the other), median.
  ``savepoint_restore_s``: the same local restore from the savepoint the job wrote.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import statelog
from statelog import ValueStateDescriptor

COUNT = ValueStateDescriptor("count", pa.int64())
UID = "bench"


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _write(root: str, keys: int) -> tuple[int, float]:
    """Write the state; returns the measured checkpoint and the materialization time."""
    from materializer.build import materialize

    job = statelog.open(root, max_parallelism=128)
    job.materialization_poll_s = 0
    maxp = job.max_parallelism
    backends = [job.backend(UID, subtask=i, parallelism=2) for i in range(2)]
    states = [b.get_state(COUNT) for b in backends]
    owner = [statelog.subtask_for_key_group(maxp, 2, kg) for kg in range(maxp)]
    route = [owner[statelog.key_group_of(k, maxp)] for k in range(keys)]
    for k in range(keys):
        i = route[k]
        backends[i].set_current_key(k)
        states[i].update(k)
    meta = job.checkpoint(sources={"offset": keys})
    t0 = time.perf_counter()
    materialize(job.store, meta)
    mat_s = time.perf_counter() - t0
    for k in range(0, keys, 100):
        i = route[k]
        backends[i].set_current_key(k)
        states[i].update(-k)
    cid = job.checkpoint(sources={"offset": keys + keys // 100}).checkpoint_id
    job.close()
    return cid, mat_s


def _local_restore(root: str, which: Any, parallelism: int) -> tuple[float, int]:
    job = statelog.open(root, create=False)
    try:
        t0 = time.perf_counter()
        rows = 0
        for i in range(parallelism):
            b = job.backend(UID, subtask=i, parallelism=parallelism, restore=which, changelog=False)
            b.get_state(COUNT)
            rows += sum(1 for _ in b.entries("count"))
            b.close()
        return time.perf_counter() - t0, rows
    finally:
        job.close()


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    import statelog.spark
    from statelog.spark.rescale.driver import restore

    keys, rounds, new_p = (20_000, 2, 4) if quick else (1_000_000, 3, 4)
    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix="statelog-bench-spark-")
        root = Path(tmp).as_uri()
    root = root.rstrip("/") + "/spark"
    spark = None
    try:
        t0 = time.perf_counter()
        cid, mat_s = _write(root, keys)
        _log(progress, f"wrote {keys:,} keys at p=2, materialized in {mat_s:.1f}s, checkpoint {cid} "
                       f"({time.perf_counter() - t0:.1f}s)")
        t0 = time.perf_counter()
        spark = statelog.spark.session()
        start_s = time.perf_counter() - t0
        _log(progress, f"spark session in {start_s:.1f}s")

        def scan(**options: str) -> float:
            df = statelog.spark.read_state(spark, root, UID, "count", checkpoint=cid, **options)
            t = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - t

        scan(keyType="int64")  # warm-up: Python workers, imports
        typed, untyped = [], []
        for r in range(rounds):
            typed.append(scan(keyType="int64"))
            untyped.append(scan())
            _log(progress, f"scan {r}: {keys / typed[-1]:,.0f} rows/s typed key, "
                           f"{keys / untyped[-1]:,.0f} rows/s untyped key")
        n = statelog.spark.read_state(spark, root, UID, "count", checkpoint=cid).count()
        assert n == keys, (n, keys)
        jobs_s, local_s, sp_s = [], [], []
        for r in range(rounds):
            t = time.perf_counter()
            res = restore(spark, root, cid, parallelism=new_p, savepoint=f"bench-{r}")
            jobs_s.append(time.perf_counter() - t)
            assert res.rows == keys, res.rows
            lt, rows = _local_restore(root, cid, new_p)
            assert rows == keys
            local_s.append(lt)
            st, rows = _local_restore(root, f"savepoint:bench-{r}", new_p)
            assert rows == keys
            sp_s.append(st)
            _log(progress, f"restore {r}: spark job {jobs_s[-1]:.2f}s, local restore {lt:.2f}s, "
                           f"local restore from the savepoint {st:.2f}s")
    finally:
        if spark is not None:
            spark.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return {
        "keys": keys,
        "rounds": rounds,
        "spark_start_s": round(start_s, 2),
        "materialize_s": round(mat_s, 2),
        "sql_scan_s": round(statistics.median(typed), 3),
        "sql_rows_per_s": round(keys / statistics.median(typed)),
        "sql_rows_per_s_untyped_key": round(keys / statistics.median(untyped)),
        "restore_parallelism": new_p,
        "restore_job_s": round(statistics.median(jobs_s), 3),
        "local_restore_s": round(statistics.median(local_s), 3),
        "savepoint_restore_s": round(statistics.median(sp_s), 3),
    }
