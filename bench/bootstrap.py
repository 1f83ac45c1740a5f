"""State processor benchmark: rows/s written into a savepoint from pyarrow and from Spark,
beside the materializer's rows/s on the same state.

* ``pyarrow_rows_per_s``: :class:`statelog.state_processor.SavepointWriter` in this process,
  ``ROWS`` int64 keys of a ``ValueState<int64>`` (columns ``key``, ``value``): checks, key
  encoding and key groups, sorting, Parquet per key-group unit, manifest and metadata, into a
  new savepoint per round; rows / median seconds over the rounds.
* ``spark_rows_per_s``: :func:`statelog.spark.writer.write_savepoint` of the same rows as a
  DataFrame (``spark.range``) on Spark ``local[2]`` (repartition by key-group unit, executors
  write their units, the driver publishes); session start and a warm-up round not measured.
* ``materializer_rows_per_s``: the same keys written by a backend and checkpointed, then
  ``materializer.build.materialize`` of that checkpoint (reading the changelog, writing the
  tables and the manifest), rows / median seconds.
* ``verified``: ``statelog verify`` passed on every root written (every savepoint included).
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
from materializer.build import materialize
from statelog import ValueStateDescriptor
from statelog.state_processor import SavepointWriter
from tools.roots import open_root
from tools.verify import verify_root

COUNT = ValueStateDescriptor("count", pa.int64())
UID = "bench"
MAXP = 128


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _stats(rows: int, seconds: list[float]) -> dict[str, Any]:
    rates = sorted(rows / s for s in seconds)
    return {"median": round(statistics.median(rates)), "min": round(rates[0]), "max": round(rates[-1])}


def _pyarrow_round(root: str, name: str, table: pa.Table) -> float:
    t0 = time.perf_counter()
    with SavepointWriter(root, name, max_parallelism=MAXP) as w:
        w.add(UID, COUNT, table)
        w.publish()
    return time.perf_counter() - t0


def _materializer_round(root: str, rows: int) -> float:
    job = statelog.open(root, max_parallelism=MAXP)
    job.materialization_poll_s = 0
    try:
        b = job.backend(UID)
        s = b.get_state(COUNT)
        for k in range(rows):
            b.set_current_key(k)
            s.update(k)
        meta = job.checkpoint(sources={"offset": rows})
        t0 = time.perf_counter()
        materialize(job.store, meta)
        return time.perf_counter() - t0
    finally:
        job.close()


def _verified(root: str) -> bool:
    with open_root(root, {}) as r:
        return verify_root(r).ok


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    import statelog.spark
    from statelog.spark.writer import write_savepoint

    rows, rounds = (20_000, 2) if quick else (1_000_000, 3)
    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix="statelog-bench-bootstrap-")
        root = Path(tmp).as_uri()
    base = root.rstrip("/")
    spark = None
    try:
        table = pa.table({"key": pa.array(range(rows), pa.int64()), "value": pa.array(range(rows), pa.int64())})
        pyarrow_s = []
        for r in range(rounds):
            pyarrow_s.append(_pyarrow_round(f"{base}/pyarrow", f"bench-{r}", table))
            _log(progress, f"pyarrow {r}: {rows / pyarrow_s[-1]:,.0f} rows/s")
        mat_s = []
        for r in range(rounds):
            mat_s.append(_materializer_round(f"{base}/materializer-{r}", rows))
            _log(progress, f"materializer {r}: {rows / mat_s[-1]:,.0f} rows/s")
        t0 = time.perf_counter()
        spark = statelog.spark.session("local[2]")
        _log(progress, f"spark session in {time.perf_counter() - t0:.1f}s")
        df = spark.range(rows).selectExpr("id AS key", "id AS value")
        spark_s = []
        for r in range(rounds + 1):  # round 0 warms up the Python workers
            t = time.perf_counter()
            meta = write_savepoint(f"{base}/spark", f"bench-{r}", {(UID, "count"): (COUNT, df)}, max_parallelism=MAXP)
            assert meta.stats["rows"] == rows, meta.stats
            if r:
                spark_s.append(time.perf_counter() - t)
                _log(progress, f"spark {r}: {rows / spark_s[-1]:,.0f} rows/s")
        verified = all(_verified(f"{base}/{d}") for d in ("pyarrow", "spark", *(f"materializer-{r}" for r in range(rounds))))
    finally:
        if spark is not None:
            spark.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    py, sp, mat = _stats(rows, pyarrow_s), _stats(rows, spark_s), _stats(rows, mat_s)
    return {
        "rows": rows,
        "rounds": rounds,
        "pyarrow_rows_per_s": py["median"],
        "pyarrow_rows_per_s_range": [py["min"], py["max"]],
        "spark_rows_per_s": sp["median"],
        "spark_rows_per_s_range": [sp["min"], sp["max"]],
        "spark_master": "local[2]",
        "materializer_rows_per_s": mat["median"],
        "materializer_rows_per_s_range": [mat["min"], mat["max"]],
        "verified": verified,
    }
