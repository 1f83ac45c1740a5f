"""Runtime benchmark: a keyed count with checkpoints every second, on statelog's changelog,
on the state-dump baseline and without checkpoints, and on Spark Structured Streaming.

* **Input**: ``bench.spark_streaming.make_input``: Parquet files of ``(key int64, ts int64)``
  events, keys uniform over ``[0, keys)``. The runtime reads them with ``ParquetSource``
  (uid ``events``, one split per file, ``row="tuple"``); Spark reads the same files.
* **Job** (``runtime``, parallelism 2, exactly-once aligned mode, ``file://`` root in a
  temporary directory): ``ParquetSource -> key_by(key) -> count`` where ``count`` is a keyed
  process function keeping a ``ValueState<int64>`` per key (``+= 1`` per event, no output).
* **Throughput** (``THROUGHPUT_KEYS`` = 100k keys, ``THROUGHPUT_EVENTS`` events): the same job
  with (a) the changelog backend and a checkpoint every second (``events_per_s_changelog``),
  (b) no checkpoints and no changelog (``events_per_s_no_checkpoint``: plain in-memory state,
  the state-dump baseline without checkpoint interval; only the end-of-input checkpoint
  that commits the sinks is taken), (c) the state-dump baseline
  (``bench/baselines/state_dump_backend.py``: every checkpoint serializes the whole state of each subtask)
  and a checkpoint every second (``events_per_s_full_snapshot``). events/s = input events ÷
  the job's wall time (``JobResult.duration_s``: workers started, input read to its end,
  final checkpoint). After one warm-up run (not counted: the first job of a process also
  starts the forkserver), the three variants run ``ROUNDS`` times, interleaved; the median
  counts.
  ``changelog_overhead`` = 1 - changelog ÷ no-checkpoint (target ≤ 0.15).
* **Checkpoint durations** (``DURATION_KEYS`` = 10^6 keys, ``DURATION_EVENTS`` events): the
  changelog and the state-dump job with a checkpoint every second; the duration of a
  checkpoint is trigger to completion at the coordinator (``duration_ms`` of its statistics:
  barrier travel, alignment, the synchronous part, the upload, acknowledgements, publication).
  p50 and p99 by nearest rank over all checkpoints of the run (with fewer than 100 of them
  p99 is the slowest). ``checkpoint_p99_ratio`` = state dump ÷ changelog (target ≥ 10).
* **Spark** (``bench.spark_streaming.run_spark``, ``local[2]``): the same throughput input;
  ``groupBy("key").count()`` in update mode (``events_per_s_spark_sql``, all of the input) and
  ``applyInPandasWithState`` keeping the count (``events_per_s_spark_python``, the first
  ``SPARK_PYTHON_FILES`` files: it is too slow for all of them). Targets:
  changelog ≥ 20× spark_python and ≥ 1× spark_sql.
* **Checks**: the changelog runs restore their final checkpoint and compare the total count
  with the input; a mismatch aborts the benchmark.
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
from bench.baselines.state_dump_backend import StateDumpBackend
from runtime import (
    CollectSink,
    KeyedProcessFunction,
    ParquetSource,
    StreamExecutionEnvironment,
)
from statelog import ValueStateDescriptor

THROUGHPUT_KEYS = 100_000
THROUGHPUT_EVENTS = 2_000_000
DURATION_KEYS = 1_000_000
DURATION_EVENTS = 4_000_000
FILES = 20
ROUNDS = 7
SPARK_PYTHON_FILES = 2
UID = "count"
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def first(e: tuple[Any, ...]) -> Any:
    return e[0]


class CountPerKey(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, e: Any, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def run_job(input_dir: Path, root: str, backend: str, interval_s: float | None, *, parallelism: int = 2,
            cluster: str = "local", spark: Any = None) -> Any:
    """The keyed count; ``cluster``/``spark`` as for ``env.execute`` (bench/scale.py)."""
    env = StreamExecutionEnvironment(
        parallelism=parallelism,
        checkpoint_interval_s=interval_s,
        checkpoint_timeout_s=120.0,
        state_root=root,
        state_backend=StateDumpBackend() if backend == StateDumpBackend.name else backend,
    )
    events = env.from_source(ParquetSource(input_dir, "input-*.parquet", columns=["key"], row="tuple"), uid="events")
    events.key_by(first).process(CountPerKey(), uid=UID).sink_to(CollectSink(), uid="out")
    return env.execute(f"bench-{backend}", cluster=cluster, spark=spark)


def total_count(root: str, checkpoint_id: int, parallelism: int = 2) -> int:
    with statelog.open(root, create=False) as job:
        total = 0
        for i in range(parallelism):
            b = job.backend(UID, subtask=i, parallelism=parallelism, restore=checkpoint_id, changelog=False)
            b.get_state(COUNT)
            total += sum(v for _, _, v in b.entries("count"))
            b.close()
        return total


def run_checked(input_dir: Path, root_dir: Path, backend: str, interval_s: float | None, events: int) -> Any:
    """``run_job`` on a fresh root that is deleted afterwards; a changelog run must restore
    its final checkpoint to a total count of ``events``."""
    try:
        res = run_job(input_dir, root_dir.as_uri(), backend, interval_s)
        if backend == "changelog":
            got = total_count(root_dir.as_uri(), res.final_checkpoint)
            if got != events:
                raise RuntimeError(f"changelog run: the final checkpoint counts {got} events, not {events}")
        return res
    finally:
        shutil.rmtree(root_dir, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(-(-q * len(s) // 1)) - 1))]


def durations(result: Any) -> list[float]:
    return [st["duration_ms"] for st in result.checkpoint_stats.values()]


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    from bench.spark_streaming import make_input, run_spark

    tp_keys, tp_events = (10_000, 200_000) if quick else (THROUGHPUT_KEYS, THROUGHPUT_EVENTS)
    d_keys, d_events = (50_000, 200_000) if quick else (DURATION_KEYS, DURATION_EVENTS)
    rounds = 1 if quick else ROUNDS
    files = 4 if quick else FILES
    if root is not None:
        raise SystemExit("bench runtime uses fresh temporary roots (file://); --root is not supported")
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-runtime-"))
    try:
        tp_dir, d_dir = work / "throughput-input", work / "duration-input"
        t = time.perf_counter()
        make_input(tp_dir, tp_events, tp_keys, files)
        make_input(d_dir, d_events, d_keys, files, seed=11)
        _log(progress, f"inputs written in {time.perf_counter() - t:.1f}s")

        rates: dict[str, list[float]] = {"changelog": [], "no_checkpoint": [], "full_snapshot": []}
        checkpoints: dict[str, list[int]] = {k: [] for k in rates}
        n = 0
        # warm-up, not counted: the first job of a process starts the forkserver, which
        # preloads the runtime (about half a second inside that job's wall time)
        t = time.perf_counter()
        run_checked(tp_dir, work / "root-warm-up", "state-dump", None, tp_events)
        _log(progress, f"warm-up run in {time.perf_counter() - t:.1f}s")
        for r in range(rounds):
            for name, backend, interval in (
                ("changelog", "changelog", 1.0),
                ("no_checkpoint", "state-dump", None),
                ("full_snapshot", "state-dump", 1.0),
            ):
                n += 1
                res = run_checked(tp_dir, work / f"root-{n}", backend, interval, tp_events)
                rates[name].append(tp_events / res.duration_s)
                checkpoints[name].append(len(res.completed_checkpoints))
                _log(progress, f"round {r + 1} {name}: {rates[name][-1]:,.0f} events/s "
                     f"({res.duration_s:.2f}s, {len(res.completed_checkpoints)} checkpoints)")

        dur: dict[str, list[float]] = {}
        d_rates: dict[str, float] = {}
        d_bytes: dict[str, int] = {}
        for name, backend in (("changelog", "changelog"), ("full_snapshot", "state-dump")):
            n += 1
            res = run_checked(d_dir, work / f"root-{n}", backend, 1.0, d_events)
            dur[name] = durations(res)
            d_rates[name] = d_events / res.duration_s
            d_bytes[name] = max((st.get("incremental_bytes", 0) for st in res.checkpoint_stats.values()), default=0)
            _log(progress, f"{d_keys:,} keys {name}: {len(dur[name])} checkpoints, p50 "
                 f"{percentile(dur[name], 0.5):.1f} ms, p99 {percentile(dur[name], 0.99):.1f} ms")

        spark = run_spark(
            tp_dir, events=tp_events, keys=tp_keys,
            python_files=1 if quick else SPARK_PYTHON_FILES, progress=progress,
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cl = statistics.median(rates["changelog"])
    none = statistics.median(rates["no_checkpoint"])
    full = statistics.median(rates["full_snapshot"])
    p99_cl, p99_full = percentile(dur["changelog"], 0.99), percentile(dur["full_snapshot"], 0.99)
    sp_py, sp_sql = spark["events_per_s_spark_python"], spark["events_per_s_spark_sql"]
    return {
        "throughput_keys": tp_keys,
        "throughput_events": tp_events,
        "rounds": rounds,
        "events_per_s_changelog": round(cl),
        "events_per_s_no_checkpoint": round(none),
        "events_per_s_full_snapshot": round(full),
        "changelog_overhead": round(1 - cl / none, 3),
        "checkpoints_per_run_changelog": checkpoints["changelog"],
        "checkpoints_per_run_full_snapshot": checkpoints["full_snapshot"],
        "duration_keys": d_keys,
        "duration_events": d_events,
        "checkpoints_changelog": len(dur["changelog"]),
        "checkpoints_full_snapshot": len(dur["full_snapshot"]),
        "checkpoint_p50_ms_changelog": round(percentile(dur["changelog"], 0.5), 1),
        "checkpoint_p99_ms_changelog": round(p99_cl, 1),
        "checkpoint_p50_ms_full_snapshot": round(percentile(dur["full_snapshot"], 0.5), 1),
        "checkpoint_p99_ms_full_snapshot": round(p99_full, 1),
        "checkpoint_p99_ratio": round(p99_full / p99_cl, 1),
        "checkpoint_max_bytes_changelog": d_bytes["changelog"],
        "checkpoint_max_bytes_full_snapshot": d_bytes["full_snapshot"],
        "events_per_s_changelog_1m_keys": round(d_rates["changelog"]),
        "events_per_s_full_snapshot_1m_keys": round(d_rates["full_snapshot"]),
        "events_per_s_spark_sql": round(sp_sql),
        "events_per_s_spark_python": round(sp_py),
        "spark_sql_events": spark.get("spark_sql_events"),
        "spark_python_events": spark.get("spark_python_events"),
        "changelog_vs_spark_sql": round(cl / sp_sql, 1),
        "changelog_vs_spark_python": round(cl / sp_py, 1),
    }
