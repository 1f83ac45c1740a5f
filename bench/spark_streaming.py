"""Spark Structured Streaming side of the keyed-count benchmark (used by ``bench/runtime.py``).

The same input as the statelog runtime bench (``make_input``: Parquet files of ``key int64``,
``ts int64`` events, in stream order) is counted per key by two Spark queries, one after the
other, in one SparkSession:

* ``events_per_s_spark_sql``: ``groupBy("key").count()``, output mode ``update`` (Spark's
  own aggregation and state store, no Python in the data path).
* ``events_per_s_spark_python``: ``groupBy("key").applyInPandasWithState(count_state, ...,
  "update", GroupStateTimeout.NoTimeout)``; ``count_state`` adds the group's rows to the
  count kept in the group state and yields the updated ``(key, count)`` row (one call per
  key per micro-batch, as a user would write it).

How it runs:

* SparkSession ``local[2]`` (``statelog.spark.session``: UI and progress bar off, log level
  ERROR, workers run this interpreter), ``spark.sql.shuffle.partitions`` = 2
  (``SHUFFLE_PARTITIONS``: one state-store partition per core; AQE does not apply to
  stateful streaming queries). Default (HDFS-backed) state store.
* Source ``readStream.schema(...).option("maxFilesPerTrigger", files_per_trigger)
  .parquet(dir)``, trigger ``availableNow=True``, so the input is processed as
  ``files / files_per_trigger`` micro-batches (Spark orders files by modification time;
  ``make_input`` sets increasing mtimes in name order). Each query has its own temporary
  checkpoint location.
* Sink ``noop``: every output row of every micro-batch is computed and handed to the sink
  (the state is updated and committed each batch) but nothing is collected or written.
* Measured: wall time from ``start()`` to ``awaitTermination()`` returning (all micro-batches
  including their state commits); events/s = input rows the query processed (sum of
  ``numInputRows`` of its progress reports) / that time. A small warm-up run of both
  queries comes first and is not measured (JVM, code generation, Python workers).
* The Python query is slow (on the order of 1 ms per key and micro-batch), so by default
  it processes only a prefix of the input files (``python_files``; the default takes files
  while the sum of distinct keys per micro-batch stays within ``PYTHON_GROUP_BUDGET``, at
  least one file), hard-linked into a separate directory. ``spark_python_events`` /
  ``spark_sql_events`` report what each query processed; its events/s is over that.
  The Python rate depends mostly on distinct keys per micro-batch, not on events.

Checks (raise ``AssertionError`` on failure): each query processed exactly the rows of its
files; for every micro-batch its input rows and its output rows (sink ``numOutputRows``:
one updated row per distinct key of the batch in update mode) match the files that batch
should have read (when the mtimes give an unambiguous order); and the final state of every
key, read back through Spark's state data source (``format("statestore")`` on the
checkpoint), equals that key's count in the input (all keys, both queries).

Run alone: ``python -m bench.spark_streaming --events N --keys K [--files F]`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TS0 = 1_735_689_600_000
ROW_GROUP = 65_536
SHUFFLE_PARTITIONS = 2
# Default Python prefix: distinct keys summed over its micro-batches, plus PYTHON_BATCH_COST
# per micro-batch. One key in one micro-batch costs ~0.65 ms on an idle 2-core machine
# (1.6 ms measured with other jobs running), so the budget is ~60 s when idle.
PYTHON_GROUP_BUDGET = 90_000
PYTHON_BATCH_COST = 1_000
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64())])
_MTIME0_NS = 1_735_689_600 * 10**9


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def make_input(directory: str | Path, events: int, keys: int, files: int, seed: int = 7) -> list[Path]:
    """Write ``events`` events as ``files`` Parquet files ``input-00000.parquet``, ... (name
    order = stream order, also set as increasing modification times, one second apart).

    Schema ``key int64``, ``ts int64``. Keys are in ``[0, keys)``: each key occurs
    ``events // keys`` times, ``events % keys`` distinct keys (chosen by ``seed``) once more,
    in an order shuffled by ``seed`` (so every key occurs when ``events >= keys``).
    ``ts`` is the event time in ms, ``TS0 + i`` for the i-th event. Files hold equal
    shares (±1) of the events, in row groups of ``ROW_GROUP`` rows. Returns the paths.
    """
    if events < 0 or keys < 1 or files < 1:
        raise ValueError(f"need events >= 0, keys >= 1, files >= 1 (got {events}, {keys}, {files})")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    seq = list(range(keys)) * (events // keys) + rng.sample(range(keys), events % keys)
    rng.shuffle(seq)
    paths = []
    for f in range(files):
        lo, hi = events * f // files, events * (f + 1) // files
        table = pa.table({"key": pa.array(seq[lo:hi], pa.int64()),
                          "ts": pa.array(range(TS0 + lo, TS0 + hi), pa.int64())}, schema=SCHEMA)
        path = directory / f"input-{f:05d}.parquet"
        pq.write_table(table, path, row_group_size=ROW_GROUP)
        t = _MTIME0_NS + f * 10**9
        os.utime(path, ns=(t, t))
        paths.append(path)
    return paths


def count_state(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """``applyInPandasWithState`` function: add the group's rows to the count in the state."""
    import pandas as pd

    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n,))
    yield pd.DataFrame({"key": [key[0]], "count": [n]})


def _keys(paths: list[Path]) -> pa.ChunkedArray:
    return pa.chunked_array([pq.read_table(p, columns=["key"]).column("key").combine_chunks()
                             for p in paths], pa.int64())


def _counts(paths: list[Path]) -> dict[int, int]:
    vc = pc.value_counts(_keys(paths))
    return dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))


def _batches(paths: list[Path], files_per_trigger: int) -> list[tuple[int, int]] | None:
    """Expected (input rows, distinct keys) per micro-batch, or None if the order is ambiguous."""
    order = sorted(paths, key=lambda p: (p.stat().st_mtime_ns, p.name))
    mtimes = [p.stat().st_mtime_ns for p in order]
    if len(set(mtimes)) != len(mtimes):
        return None
    out = []
    for i in range(0, len(order), files_per_trigger):
        keys = _keys(order[i:i + files_per_trigger])
        out.append((len(keys), pc.count_distinct(keys).as_py()))
    return out


def _run_query(spark: Any, src: Path, variant: str, files_per_trigger: int, ckpt: Path) -> dict[str, Any]:
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("key", LongType()), StructField("ts", LongType())])
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_trigger).parquet(str(src))
    if variant == "sql":
        out = df.groupBy("key").count()
    else:
        out = df.groupBy("key").applyInPandasWithState(
            count_state, "key long, count long", "count long", "update", GroupStateTimeout.NoTimeout)
    w = (out.writeStream.format("noop").outputMode("update").option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True))
    t0 = time.perf_counter()
    q = w.start()
    q.awaitTermination()
    secs = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(f"spark {variant} query failed: {q.exception()}")
    reports = [p for p in q.recentProgress if p["numInputRows"] > 0]
    return {"s": secs, "events": sum(p["numInputRows"] for p in reports), "reports": reports}


def _check(spark: Any, variant: str, run: dict[str, Any], paths: list[Path], ckpt: Path,
           files_per_trigger: int) -> None:
    rows = sum(pq.read_metadata(p).num_rows for p in paths)
    if run["events"] != rows:
        raise AssertionError(f"spark {variant}: processed {run['events']} events, input has {rows}")
    expected_batches = _batches(paths, files_per_trigger)
    if expected_batches is not None:
        got = [(p["numInputRows"], p["sink"]["numOutputRows"]) for p in run["reports"]]
        if got != expected_batches:
            raise AssertionError(f"spark {variant}: (input rows, output rows) per micro-batch "
                                 f"{got[:5]}..., expected {expected_batches[:5]}...")
    value = "value.count" if variant == "sql" else "value.groupState.count"
    state = (spark.read.format("statestore").load(str(ckpt))
             .selectExpr("key.key AS key", f"{value} AS count").toArrow())
    got_counts = dict(zip(state.column("key").to_pylist(), state.column("count").to_pylist(), strict=True))
    expected = _counts(paths)
    if got_counts != expected:
        bad = [(k, got_counts.get(k), expected.get(k)) for k in sorted(set(got_counts) | set(expected))
               if got_counts.get(k) != expected.get(k)]
        raise AssertionError(f"spark {variant}: {len(bad)} keys with a wrong final count in the state "
                             f"(key, state, input): {bad[:5]}")


def _default_python_files(paths: list[Path], files_per_trigger: int) -> int:
    n, cost = 0, 0
    for i in range(0, len(paths), files_per_trigger):
        chunk = paths[i:i + files_per_trigger]
        cost += pc.count_distinct(_keys(chunk)).as_py() + PYTHON_BATCH_COST
        if n and cost > PYTHON_GROUP_BUDGET:
            break
        n += len(chunk)
    return max(n, 1)


def run_spark(input_dir: str | Path, *, events: int, keys: int, files_per_trigger: int = 1,
              python_files: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Run both Spark queries on the ``input-*.parquet`` files of ``input_dir`` (see the module
    docstring) and return events/s and absolute figures. ``events`` and ``keys`` describe the
    input (checked). ``python_files``: the Python query processes only the first N files
    (default: see ``PYTHON_GROUP_BUDGET``); ``progress`` logs to stderr.
    """
    from pyspark.sql import SparkSession

    import statelog.spark

    input_dir = Path(input_dir)
    paths = sorted(input_dir.glob("input-*.parquet"))
    if not paths:
        raise FileNotFoundError(f"no input-*.parquet in {input_dir}")
    rows = sum(pq.read_metadata(p).num_rows for p in paths)
    if rows != events:
        raise ValueError(f"{input_dir} holds {rows} events, not {events}")
    if python_files is None:
        python_files = _default_python_files(paths, files_per_trigger)
    python_files = max(1, min(python_files, len(paths)))
    res: dict[str, Any] = {"spark_master": "local[2]", "spark_shuffle_partitions": SHUFFLE_PARTITIONS,
                           "spark_files": len(paths), "spark_files_per_trigger": files_per_trigger,
                           "spark_python_files": python_files, "keys": keys}
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-spark-streaming-"))
    existing = SparkSession.getActiveSession()
    spark = None
    try:
        t0 = time.perf_counter()
        spark = statelog.spark.session(
            master="local[2]", app_name="statelog-bench-spark-streaming",
            conf={"spark.sql.shuffle.partitions": SHUFFLE_PARTITIONS,
                  "spark.sql.streaming.numRecentProgressUpdates": 100_000})
        # getOrCreate() returns an existing session unchanged; the runtime conf still applies.
        spark.conf.set("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        res["spark_master"] = spark.sparkContext.master
        res["spark_start_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        warm = make_input(work / "warm-input", 2_000, 200, 2)
        for variant in ("sql", "python"):
            run = _run_query(spark, work / "warm-input", variant, 1, work / f"warm-{variant}")
            _check(spark, variant, run, warm, work / f"warm-{variant}", 1)
        res["spark_warmup_s"] = round(time.perf_counter() - t0, 2)
        _log(progress, f"spark {res['spark_master']} up in {res['spark_start_s']}s, "
                       f"warm-up {res['spark_warmup_s']}s")

        pdir = work / "python-input"
        pdir.mkdir()
        for p in paths[:python_files]:
            try:
                os.link(p, pdir / p.name)  # same inode: same mtime
            except OSError:
                shutil.copy2(p, pdir / p.name)
        for variant, src, files in (("sql", input_dir, paths),
                                    ("python", pdir, sorted(pdir.glob("input-*.parquet")))):
            ckpt = work / f"checkpoint-{variant}"
            run = _run_query(spark, src, variant, files_per_trigger, ckpt)
            t0 = time.perf_counter()
            _check(spark, variant, run, files, ckpt, files_per_trigger)
            check_s = time.perf_counter() - t0
            eps = run["events"] / run["s"]
            res.update({f"events_per_s_spark_{variant}": round(eps, 1),
                        f"spark_{variant}_events": run["events"],
                        f"spark_{variant}_s": round(run["s"], 3),
                        f"spark_batches_{variant}": len(run["reports"]),
                        f"spark_{variant}_keys": len(_counts(files))})
            _log(progress, f"spark {variant}: {run['events']:,} events in {len(run['reports'])} "
                           f"micro-batches, {run['s']:.1f}s = {eps:,.0f} events/s "
                           f"(checked in {check_s:.1f}s)")
    finally:
        if spark is not None and existing is None:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_streaming",
                                     description="Spark Structured Streaming keyed count (JSON)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10, help="input files (micro-batches)")
    parser.add_argument("--files-per-trigger", type=int, default=1)
    parser.add_argument("--python-files", type=int, default=None,
                        help="files the Python query processes (default: a budget, see docstring)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="statelog-bench-spark-streaming-input-")
    try:
        t0 = time.perf_counter()
        make_input(tmp, args.events, args.keys, args.files, seed=args.seed)
        _log(True, f"input: {args.events:,} events, {args.keys:,} keys, {args.files} files "
                   f"in {time.perf_counter() - t0:.1f}s")
        res = run_spark(tmp, events=args.events, keys=args.keys, files_per_trigger=args.files_per_trigger,
                        python_files=args.python_files, progress=True)
        print(json.dumps(res, sort_keys=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
