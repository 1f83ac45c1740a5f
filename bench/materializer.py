"""Materializer benchmark: materialization throughput, restore time and space amplification.

* ``materialize_rows_per_s``: a ValueState of ``KEYS`` keys (10^6) is checkpointed and
  materialized from its changelog (first, full materialization); then 1 % of the keys
  change and an incremental materialization is measured too. Medians over rounds.
* ``restore_ratio``: on that state, after a materialization plus a tail (1 % of the keys
  changed after it), the time to restore a backend from the checkpoint (reading the
  checkpoint metadata, the manifest, the Parquet tables and the changelog tail from the
  store, loading them into a backend) ÷ the time to restore the same state from a full
  snapshot of it (reading the one Arrow IPC object from the same store, loading it with
  the same bulk loader). Both start from an open job, after a garbage collection and with
  the cyclic GC paused while timed. ``RESTORE_PAIRS`` pairs per round, back to back with
  alternating order; the median of all pair ratios is reported, with its quartiles.
* ``space_amplification_value`` / ``space_amplification_window``: a workload runs in
  virtual time with a checkpoint every second, the materializer's default triggers
  (``materializer.options.due``: 60 s or 256 MB of tail) and GC after each
  materialization; at every checkpoint in steady state (after the first materialization
  was adopted, and for the window workload after the first windows fired) the bytes of all distinct objects referenced by the retained checkpoints
  (segments, manifests, table files) are divided by the bytes of one full snapshot of the
  state at that moment; the mean over the steady state is reported (and the max).
  Value workload: ``VALUE_KEYS`` keys, ``VALUE_RATE`` random read-modify-write updates per
  second. Window workload: sliding event-time windows (size ``WINDOW_S``, slide
  ``SLIDE_S``) counting events per user into a ValueState per window namespace, with an
  event-time timer per window that fires, emits and clears it.
"""

from __future__ import annotations

import contextlib
import gc
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

import statelog
from bench.baselines.state_dump import decode_state_dump, encode_state_dump
from materializer.build import materialize
from materializer.gc.collect import collect_garbage
from materializer.options import due
from statelog import ValueStateDescriptor
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.layout import bench_state_dump_key
from statelog.materialization.manifest import latest_manifest_key, load_manifest
from statelog.restore.changes import RestoredChanges
from statelog.restore.collector import gc_paused
from statelog.state.backend import KeyedStateBackend

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
RESTORE_PAIRS = 5  # restore pairs per round
DEFAULT_INTERVAL_S = 60.0
DEFAULT_MAX_TAIL = 256 << 20


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Time without the cyclic GC: a collection first, none during the timed section.

    Both restores build the same million-entry dict; the first collection after it traverses
    it (tens of ms) wherever it happens to fall, inside one timed section or after the other.
    """
    gc.collect()
    with gc_paused():
        yield


def _restore_from_snapshot(data: bytes, like: KeyedStateBackend) -> KeyedStateBackend:
    """Rebuild a backend from a full snapshot with the bulk loader a table restore uses."""
    tables = decode_state_dump(data, "snapshot")
    rc = RestoredChanges()
    for name, table in tables.items():
        rc.infos[name] = like._states[name].info
        rc.base[name] = [table]
    b = KeyedStateBackend(operator_uid="restored", max_parallelism=like.max_parallelism, restored=rc)
    b.get_state(COUNT)
    return b


def _time_table_restore(root: str, checkpoint_id: int) -> tuple[float, KeyedStateBackend]:
    """Restore from the checkpoint's tables and tail: (seconds, backend)."""
    with statelog.open(root) as job2, _no_gc():
        t0 = time.perf_counter()
        b2 = job2.backend("state", restore=checkpoint_id, changelog=False)
        b2.get_state(COUNT)
        b2.wait_loaded()  # the whole state, also when it restores on demand (the default)
        return time.perf_counter() - t0, b2


def _time_snapshot_restore(store: Any, key: str, like: KeyedStateBackend) -> tuple[float, KeyedStateBackend]:
    """Restore from the full snapshot object ``key``: (seconds, backend)."""
    with _no_gc():
        t0 = time.perf_counter()
        b3 = _restore_from_snapshot(store.get(key), like)
        return time.perf_counter() - t0, b3


def _referenced_bytes(job: statelog.StateJob, metas: list[CheckpointMetadata], cache: dict) -> int:
    """Bytes of the distinct objects the given checkpoints reference."""
    sizes: dict[str, int] = {}
    for meta in metas:
        for op in meta.operators.values():
            for h in op.subtasks:
                for r in h.changelog:
                    for s in r.segments:
                        sizes[s.name] = s.size
                for part in h.materialization:
                    m = load_manifest(job.store, part.manifest, cache)
                    sizes[part.manifest] = len(m.to_bytes())
                    for mop in m.operators.values():
                        for files in mop.files.values():
                            for f in files:
                                sizes[f.path] = f.bytes
    return sum(sizes.values())


def _throughput_and_restore(root: str, keys: int, rounds: int, progress: bool) -> dict[str, Any]:
    job = statelog.open(root)
    job.materialization_poll_s = 0
    b = job.backend("state")
    st = b.get_state(COUNT)
    for k in range(keys):
        b.set_current_key(k)
        st.update(k)
    rng = random.Random(7)
    full_rates, incr_rates, ratios, t_tables, t_snaps = [], [], [], [], []
    meta = job.checkpoint(sources={"round": 0})
    for r in range(rounds):
        t0 = time.perf_counter()
        m = materialize(job.store, meta)
        dt = time.perf_counter() - t0
        (full_rates if r == 0 else incr_rates).append(m.rows / dt)
        _log(progress, f"materialization {r}: {m.rows:,} rows in {dt:.2f}s ({m.rows / dt:,.0f} rows/s), "
                       f"{m.stats['files_written']} files written, {m.stats['files_reused']} reused")
        for k in rng.sample(range(keys), max(1, keys // 100)):
            b.set_current_key(k)
            st.update(st.value() + 1)
        meta = job.checkpoint(sources={"round": r + 1})  # adopts m: the tail is the 1 % after it
        assert all(h.materialization for op in meta.operators.values() for h in op.subtasks)
        snap_key = bench_state_dump_key(f"bench-{r}")
        job.store.put(snap_key, encode_state_dump(b))

        for rep in range(RESTORE_PAIRS):
            # back to back, alternating which goes first (the VM's speed drifts)
            if rep % 2 == 0:
                t_table, b2 = _time_table_restore(root, meta.checkpoint_id)
                t_snap, b3 = _time_snapshot_restore(job.store, snap_key, b)
            else:
                t_snap, b3 = _time_snapshot_restore(job.store, snap_key, b)
                t_table, b2 = _time_table_restore(root, meta.checkpoint_id)
            n2 = sum(1 for _ in b2.entries("count"))
            n3 = sum(1 for _ in b3.entries("count"))
            assert n2 == n3 == keys, (n2, n3, keys)
            del b2, b3
            t_tables.append(t_table)
            t_snaps.append(t_snap)
            ratios.append(t_table / t_snap)
        job.store.delete(snap_key)
        _log(progress, f"restore {r}: ratios " + ", ".join(f"{x:.2f}" for x in ratios[-RESTORE_PAIRS:]))
    job.close()
    return {
        "keys": keys,
        "materialize_rows_per_s": round(statistics.median(full_rates)),
        "materialize_incremental_rows_per_s": round(statistics.median(incr_rates)) if incr_rates else None,
        "restore_s_materialized": round(statistics.median(t_tables), 3),
        "restore_s_full_snapshot": round(statistics.median(t_snaps), 3),
        "restore_ratio": round(statistics.median(ratios), 3),
        "restore_ratio_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)[::2]],
        "restore_pairs": len(ratios),
    }


class _Workload:
    def __init__(self, job: statelog.StateJob, seed: int) -> None:
        self.job = job
        self.rng = random.Random(seed)

    def second(self, t: int) -> None:
        raise NotImplementedError

    def snapshot_bytes(self) -> int:
        raise NotImplementedError


class _ValueWorkload(_Workload):
    def __init__(self, job: statelog.StateJob, keys: int, rate: int) -> None:
        super().__init__(job, 11)
        self.b = job.backend("value")
        self.st = self.b.get_state(COUNT)
        self.keys, self.rate = keys, rate
        for k in range(keys):  # the state exists before the measurement starts
            self.b.set_current_key(k)
            self.st.update(0)

    def second(self, t: int) -> None:
        sk, st, rr, n = self.b.set_current_key, self.st, self.rng.randrange, self.keys
        for _ in range(self.rate):
            sk(rr(n))
            st.update(st.value() + 1)

    def snapshot_bytes(self) -> int:
        return len(encode_state_dump(self.b))


class _WindowWorkload(_Workload):
    """Sliding event-time windows: per user and window, a count; timers fire and clear."""

    def __init__(self, job: statelog.StateJob, users: int, rate: int, size_s: int, slide_s: int) -> None:
        super().__init__(job, 13)
        self.b = job.backend("windows")
        self.st = self.b.get_state(ValueStateDescriptor("window_count", pa.int64(), default=0))
        self.users, self.rate, self.size, self.slide = users, rate, size_s, slide_s
        self.fired = 0

    def second(self, t: int) -> None:
        b, st, rr, n = self.b, self.st, self.rng.randrange, self.users
        size, slide = self.size * 1000, self.slide * 1000
        for i in range(self.rate):
            ts = t * 1000 + (i * 1000) // self.rate
            b.set_current_key(rr(n))
            last = ts - ts % slide
            start = last
            while start > ts - size:
                st.set_namespace(start)
                st.update(st.value() + 1)
                b.timers.register_event_time_timer(start + size - 1, namespace=start)
                start -= slide
        for timer in b.timers.advance_watermark(t * 1000 + 999 - 1000):  # 1 s out-of-orderness
            st.set_namespace(timer.namespace)
            st.clear()
            self.fired += 1

    def snapshot_bytes(self) -> int:
        return len(encode_state_dump(self.b))


def _amplification(
    root: str, workload: str, seconds: int, warmup_s: int, params: dict[str, Any], progress: bool
) -> dict[str, Any]:
    job = statelog.open(root, retain_checkpoints=5)
    job.materialization_poll_s = 0
    if workload == "value":
        w: _Workload = _ValueWorkload(job, params["keys"], params["rate"])
    else:
        w = _WindowWorkload(job, params["users"], params["rate"], params["window_s"], params["slide_s"])
    cache: dict = {}
    snap: int | None = None
    samples: list[float] = []
    last_mat: float | None = None
    mats = 0
    wall0 = time.time()
    for t in range(seconds):
        w.second(t)
        meta = job.checkpoint(sources={"t": t})
        now = wall0 + t  # virtual time: one checkpoint per second
        key = latest_manifest_key(job.store)
        manifest = load_manifest(job.store, key, cache) if key else None
        reason = due(meta, manifest, now, last_mat, DEFAULT_INTERVAL_S, DEFAULT_MAX_TAIL)
        if reason is not None:
            materialize(job.store, meta)
            last_mat = now
            mats += 1
            collect_garbage(job.store, retain_checkpoints=5, grace_s=0)
        if t >= warmup_s and mats and all(
            h.materialization for op in meta.operators.values() for h in op.subtasks
        ):
            retained = job.checkpoints()
            stored = _referenced_bytes(job, retained, cache)
            if snap is None or t % 10 == 0:  # the state's size changes slowly: re-measure every 10 s
                snap = w.snapshot_bytes()
            samples.append(stored / snap)
        if t % 30 == 29:
            _log(progress, f"{workload} t={t + 1}s: {mats} materializations, "
                           f"amplification now {samples[-1] if samples else float('nan'):.2f}")
    job.close()
    return {"mean": round(statistics.fmean(samples), 3), "max": round(max(samples), 3),
            "samples": len(samples), "materializations": mats}


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    keys, rounds = (20_000, 2) if quick else (1_000_000, 3)
    seconds = 70 if quick else 300  # measured seconds (the window workload warms up first)
    # update rates: 30 % of the value state's keys change per 60 s materialization interval;
    # the window workload sees ~3 events per user and window
    value_params = {"keys": 20_000, "rate": 100} if quick else {"keys": 1_000_000, "rate": 5_000}
    window_params = (
        {"users": 2_000, "rate": 20, "window_s": 300, "slide_s": 60}
        if quick else {"users": 100_000, "rate": 1_000, "window_s": 300, "slide_s": 60}
    )
    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix="statelog-bench-")
        root = Path(tmp).as_uri()
    base = root.rstrip("/")
    try:
        out = _throughput_and_restore(base + "/restore", keys, rounds, progress)
        # steady state: the value state is loaded up front; the window state is full once the
        # first windows fire (window size + slide), so samples start after that
        v = _amplification(base + "/value", "value", seconds, 0, value_params, progress)
        warm = window_params["window_s"] + window_params["slide_s"]
        w = _amplification(base + "/window", "window", seconds + warm, warm, window_params, progress)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    out.update({
        "space_amplification_value": v["mean"],
        "space_amplification_value_max": v["max"],
        "space_amplification_window": w["mean"],
        "space_amplification_window_max": w["max"],
        "amplification_seconds": {"value": seconds, "window": seconds + warm, "window_warmup": warm},
        "amplification_materializations": {"value": v["materializations"], "window": w["materializations"]},
        "value_workload": value_params,
        "window_workload": window_params,
        "triggers": {"interval_s": DEFAULT_INTERVAL_S, "max_tail_bytes": DEFAULT_MAX_TAIL},
    })
    return out
