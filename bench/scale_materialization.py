"""Spark vs in-process materialization of the same checkpoint, side by side.

``python -m bench scale_materialization --json`` (10^7 keys), or with sizes and rounds:
``python -m bench.scale_materialization --keys 1000000 --rounds 3 --json``.

The state: a ``ValueState<int64>`` of ``keys`` int keys written by ``parallelism`` subtasks
(default 4) of one operator (max_parallelism 128), checkpointed once: changelog only, so
its materialization is the full one (every key-group unit read from the changelog, merged
and written; 16 units per operator). Each round materializes that checkpoint once in this
process (:class:`~materializer.build.InProcessEngine`) and once as a Spark job
(:class:`~materializer.spark.SparkEngine`, master ``local[*]`` unless ``--master``), the
order alternating between rounds; both write to the same ``file://`` root, and the two
manifests of a round must hold the same rows and files. Times are wall clock from the
checkpoint metadata to the published manifest (the Spark session is started and its Python
workers warmed up before the first round, as in a running daemon). Reported: the medians
with min and max of both, and the median of the per-round ratios spark / in-process.
After each materialization its manifest and files are deleted (disk space).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEYS = 10**7
QUICK_KEYS = 50_000
ROUNDS = 3
PARALLELISM = 4
MAXP = 128
UID = "counter"


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def build(root: str, keys: int, parallelism: int, progress: bool) -> int:
    """Write the state at ``parallelism`` subtasks; return the checkpoint id."""
    import pyarrow as pa

    import statelog
    from statelog import ValueStateDescriptor
    from statelog.keys.groups import key_group_of, subtask_for_key_group

    desc = ValueStateDescriptor("count", pa.int64(), default=0)
    t0 = time.monotonic()
    with statelog.open(root, max_parallelism=MAXP, writer_options={"max_buffered_records": 1 << 20}) as job:
        job.materialization_poll_s = 0
        backends = [job.backend(UID, subtask=i, parallelism=parallelism) for i in range(parallelism)]
        states = [b.get_state(desc) for b in backends]
        for k in range(keys):
            i = subtask_for_key_group(MAXP, parallelism, key_group_of(k, MAXP))
            backends[i].set_current_key(k)
            states[i].update(k)
        cid = job.checkpoint().checkpoint_id
    _log(progress, f"built {keys:,} keys at parallelism {parallelism} in {time.monotonic() - t0:.1f}s")
    return cid


def _drop(store: Any, manifest: Any) -> None:
    for path in sorted(manifest.paths()):
        store.delete(path)
    store.delete(manifest.key)


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def measure(keys: int = KEYS, rounds: int = ROUNDS, *, parallelism: int = PARALLELISM, master: str | None = None,
            root: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Spark vs in-process materialization time of one checkpoint of ``keys`` keys (module docstring)."""
    import statelog
    import statelog.spark
    from materializer.build import InProcessEngine, materialize
    from materializer.spark import SparkEngine

    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix="statelog-bench-scale-mat-")
        root = (Path(tmp) / "root").as_uri()
    spark = statelog.spark.session(master or "local[*]", app_name="statelog-bench-scale-materialization")
    try:
        cid = build(root, keys, parallelism, progress)
        job = statelog.open(root, create=False)
        meta = job.load_checkpoint(cid)
        engines = {"in_process": InProcessEngine(), "spark": SparkEngine(root, spark=spark)}
        warm = materialize(job.store, meta, engine=engines["spark"])  # starts the Python workers
        _drop(job.store, warm)
        times: dict[str, list[float]] = {"in_process": [], "spark": []}
        ratios = []
        tasks = 0
        rows = 0
        for r in range(rounds):
            order = ["in_process", "spark"] if r % 2 == 0 else ["spark", "in_process"]
            got = {}
            for name in order:
                t0 = time.perf_counter()
                m = materialize(job.store, meta, engine=engines[name])
                times[name].append(time.perf_counter() - t0)
                got[name] = m
            a, b = got["in_process"], got["spark"]
            assert a.rows == b.rows == keys, (a.rows, b.rows, keys)
            assert {s: [(f.key_groups, f.rows) for f in fs] for s, fs in a.operators[UID].files.items()} == \
                {s: [(f.key_groups, f.rows) for f in fs] for s, fs in b.operators[UID].files.items()}
            rows, tasks = a.rows, engines["spark"].last_tasks
            ratios.append(times["spark"][-1] / times["in_process"][-1])
            _log(progress, f"round {r}: in-process {times['in_process'][-1]:.2f}s, spark {times['spark'][-1]:.2f}s "
                           f"({tasks} tasks), ratio {ratios[-1]:.2f}")
            _drop(job.store, a)
            _drop(job.store, b)
        job.close()
        return {
            "keys": keys,
            "rows": rows,
            "parallelism": parallelism,
            "rounds": rounds,
            "spark_master": spark.sparkContext.master,
            "spark_cores": int(spark.sparkContext.defaultParallelism),
            "spark_tasks": tasks,
            "cpus": os.cpu_count(),
            "in_process_s": _spread(times["in_process"]),
            "spark_s": _spread(times["spark"]),
            "in_process_rows_per_s": round(rows / statistics.median(times["in_process"])),
            "spark_rows_per_s": round(rows / statistics.median(times["spark"])),
            "ratio_spark_over_in_process": _spread(ratios),
        }
    finally:
        spark.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    """``python -m bench scale_materialization``: 10^7 keys (``--quick``: 5*10^4, 1 round)."""
    if quick:
        return measure(QUICK_KEYS, 1, root=root, progress=progress)
    return measure(root=root, progress=progress)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale_materialization", description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, action="append", default=None,
                   help=f"state size (repeat for several; default {KEYS})")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--parallelism", type=int, default=PARALLELISM, help="subtasks that wrote the state")
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    sizes = a.keys or [KEYS]
    results = {str(n): measure(n, a.rounds, parallelism=a.parallelism, master=a.master, progress=not a.json)
               for n in sizes}
    out: Any = results[str(sizes[0])] if len(sizes) == 1 else results
    print(json.dumps(out, sort_keys=True) if a.json else json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
