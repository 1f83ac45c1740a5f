"""Columnar benchmark: keyed updates a batch at a time (the batch state API) beside the
per-record path, in one run.

* ``count`` and ``sum`` over ``KEYS`` uniform random keys (seeded), changelog on, a checkpoint
  every second (``checkpoint_async``: the loop goes on while it becomes durable and publishes,
  as Flink's asynchronous phase; the last one is waited for, and every one must publish):
  the batch path calls ``add_many`` once per batch of ``BATCH`` records (an
  aggregating state with :class:`statelog.state.batch.CountAggregate`, a reducing state with
  ``operator.add``); the per-record path ``set_current_key`` + ``update(value() + x)`` per record
  (its fastest form). The time includes making the last records durable. Rounds alternate
  batch and per-record; medians with their spread (min, max) are reported.
* ``memory_bytes_per_key_*``: the Python heap the state holds per key after every key was
  written once (tracemalloc), each path.
* ``checkpoint_bytes_per_update_*``: bytes of changelog segments and checkpoint metadata the
  run wrote, per update.
* ``disk_*``: the count case on the disk-backed working set (``state_store="disk"``).
* 10^7 keys only with ``--large`` (some GB of memory per backend).

The machine may be loaded by other processes: compare the figures of one run.
"""

from __future__ import annotations

import operator
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import statelog
from bench import columnar_runtime
from statelog import AggregatingStateDescriptor, ReducingStateDescriptor, ValueStateDescriptor
from statelog.state.batch import CountAggregate

BATCH = 1 << 18  # records per batch call
COUNT_BATCH = AggregatingStateDescriptor("count", pa.int64(), aggregate=CountAggregate())
SUM_BATCH = ReducingStateDescriptor("sum", pa.int64(), reduce_fn=operator.add)
VALUE = ValueStateDescriptor("v", pa.int64(), default=0)


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def _open(root: str, disk: bool) -> statelog.StateJob:
    return statelog.open(Path(root).as_uri(), state_store="disk" if disk else "memory")


def _check_checkpoints(job: statelog.StateJob) -> None:
    """Every checkpoint of the run was published (those taken with ``checkpoint_async`` too)."""
    m = job.metrics
    if m.failed or m.completed < 1:
        raise RuntimeError(f"checkpoints: {m.completed} published, {m.failed} failed")


def _batch_run(root: str, case: str, keys: np.ndarray, vals: np.ndarray, disk: bool = False) -> float:
    job = _open(root, disk)
    b = job.backend("op")
    st = b.get_state(COUNT_BATCH if case == "count" else SUM_BATCH)
    karr, varr = pa.array(keys), pa.array(vals)
    n = len(keys)
    t0 = last = time.perf_counter()
    for lo in range(0, n, BATCH):
        if case == "count":
            st.add_many(karr.slice(lo, BATCH))
        else:
            st.add_many(karr.slice(lo, BATCH), varr.slice(lo, BATCH))
        now = time.perf_counter()
        if now - last >= 1.0:
            job.checkpoint_async(sources={"offset": lo})
            last = now
    job.checkpoint(sources={"offset": n})  # waits for the one in flight, then for its own
    dt = time.perf_counter() - t0
    _check_checkpoints(job)
    job.close()
    return dt


def _record_run(root: str, case: str, keys: np.ndarray, vals: np.ndarray, disk: bool = False) -> float:
    job = _open(root, disk)
    b = job.backend("op")
    st = b.get_state(VALUE)
    sk, value, update = b.set_current_key, st.value, st.update
    klist, vlist = keys.tolist(), vals.tolist()
    n = len(klist)
    t0 = last = time.perf_counter()
    for lo in range(0, n, BATCH):  # the same checkpoint cadence, checked as often
        if case == "count":
            for k in klist[lo : lo + BATCH]:
                sk(k)
                update(value() + 1)
        else:
            for k, v in zip(klist[lo : lo + BATCH], vlist[lo : lo + BATCH], strict=True):
                sk(k)
                update(value() + v)
        now = time.perf_counter()
        if now - last >= 1.0:
            job.checkpoint_async(sources={"offset": lo})
            last = now
    job.checkpoint(sources={"offset": n})  # waits for the one in flight, then for its own
    dt = time.perf_counter() - t0
    _check_checkpoints(job)
    job.close()
    return dt


def _memory_per_key(nkeys: int, batch: bool) -> float:
    """Python heap held by the state per key after writing every key once (no changelog)."""
    keys = np.arange(nkeys, dtype=np.int64)
    tmp = tempfile.mkdtemp(prefix="statelog-bench-mem-")
    tracemalloc.start()
    job = statelog.open(Path(tmp).as_uri())
    b = job.backend("mem", changelog=False)
    base = tracemalloc.get_traced_memory()[0]
    if batch:
        st = b.get_state(SUM_BATCH)
        for lo in range(0, nkeys, BATCH):
            st.add_many(pa.array(keys[lo : lo + BATCH]), pa.array(keys[lo : lo + BATCH] + 1_000_000))
    else:
        st = b.get_state(VALUE)
        for k in keys.tolist():
            b.set_current_key(k)
            st.update(k + 1_000_000)
    b._working_set.key_cache.clear()  # (only an encoding cache; the batch path does not fill it)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    job.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return used / nkeys


def _spread(xs: list[float]) -> list[float]:
    return [round(min(xs)), round(max(xs))]


def _case(tmp: str, name: str, case: str, nkeys: int, updates: int, rounds: int, disk: bool,
          progress: bool, out: dict[str, Any]) -> None:
    rng = np.random.default_rng(42)
    # warm-up (imports, the disk store's first open) outside the measured rounds
    for i, fn in enumerate((_batch_run, _record_run)):
        warm = os.path.join(tmp, f"warm-{name}-{disk}-{i}")
        fn(warm, case, np.arange(4), np.arange(4), disk)
        shutil.rmtree(warm, ignore_errors=True)
    keys = rng.integers(0, nkeys, updates, dtype=np.int64)
    vals = rng.integers(0, 100, updates, dtype=np.int64)
    rate_b: list[float] = []
    rate_r: list[float] = []
    bytes_b: list[int] = []
    bytes_r: list[int] = []
    for r in range(rounds):
        for variant, fn, rates, sizes in (("batch", _batch_run, rate_b, bytes_b), ("record", _record_run, rate_r, bytes_r)):
            root = os.path.join(tmp, f"{name}-{variant}-{r}")
            dt = fn(root, case, keys, vals, disk)
            rates.append(updates / dt)
            sizes.append(_dir_bytes(root))
            shutil.rmtree(root, ignore_errors=True)
        _log(progress, f"{name} round {r}: batch {rate_b[-1]:,.0f}/s per-record {rate_r[-1]:,.0f}/s")
    prefix = "disk_" if disk else ""
    out[f"{prefix}batch_updates_per_s_{name}"] = round(statistics.median(rate_b))
    out[f"{prefix}batch_updates_per_s_{name}_spread"] = _spread(rate_b)
    out[f"{prefix}record_updates_per_s_{name}"] = round(statistics.median(rate_r))
    out[f"{prefix}record_updates_per_s_{name}_spread"] = _spread(rate_r)
    out[f"{prefix}batch_vs_record_{name}"] = round(statistics.median(
        b / r for b, r in zip(rate_b, rate_r, strict=True)), 2)
    out[f"{prefix}checkpoint_bytes_per_update_batch_{name}"] = round(statistics.median(bytes_b) / updates, 3)
    out[f"{prefix}checkpoint_bytes_per_update_record_{name}"] = round(statistics.median(bytes_r) / updates, 3)


def run(quick: bool = False, root: str | None = None, progress: bool = True, large: bool = False) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="statelog-bench-columnar-")
    out: dict[str, Any] = {"batch_size": BATCH, "note": "2-core machine shared with other processes"}
    try:
        rounds = 1 if quick else 3
        sizes = [(10_000, 200_000)] if quick else [(100_000, 2_000_000)]
        if large:
            sizes.append((10_000_000, 20_000_000))
        for nkeys, updates in sizes:
            for case in ("count", "sum"):
                name = f"{case}_{nkeys:.0e}".replace("+0", "").replace("+", "")
                _case(tmp, name, case, nkeys, updates, rounds, False, progress, out)
        nkeys = 10_000 if quick else 100_000
        disk_updates = 100_000 if quick else 1_000_000
        _case(tmp, f"count_{nkeys:.0e}".replace("+0", ""), "count", nkeys, disk_updates, rounds, True, progress, out)
        out["memory_bytes_per_key_batch"] = round(_memory_per_key(nkeys, True), 1)
        out["memory_bytes_per_key_record"] = round(_memory_per_key(nkeys, False), 1)
        # -- the runtime's batch path (bench.columnar_runtime): runtime_events_per_s_p2 beside
        # the per-record job; the Kafka batch path: kafka_events_per_s beside the per-record
        # loop and the client alone
        out.update(columnar_runtime.run_runtime(quick, progress))
        out.update(columnar_runtime.run(quick, progress))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
