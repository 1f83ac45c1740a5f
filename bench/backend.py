"""Backend benchmark: update throughput with and without changelog, and the cost of a
changelog checkpoint versus a full snapshot of the same state.

* Updates: ``UPDATES`` read-modify-write ValueState updates over ``KEYS`` random keys
  (seeded), on a backend with changelog and on the same backend kind without one (the
  in-memory heap backend, as Flink's HashMapStateBackend). Both are measured ``ROUNDS``
  times, alternating, and the median is reported; the changelog time includes making the
  last records durable.
* Checkpoints: a state of ``STATE_KEYS`` keys is loaded and checkpointed; then 1% of the
  keys change and a changelog checkpoint is taken (trigger to published metadata, bytes
  uploaded = new segments + metadata), and a full snapshot of the same state is written
  (serialize every entry + store). Medians over ``CKPT_ROUNDS`` rounds.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import statelog
from bench.baselines.state_dump import write_state_dump
from statelog import ValueStateDescriptor
from statelog.layout import bench_state_dump_key

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _updates(job: statelog.StateJob, uid: str, changelog: bool, keys: list[int]) -> float:
    b = job.backend(uid, changelog=changelog)
    st = b.get_state(COUNT)
    sk, value, update = b.set_current_key, st.value, st.update
    t0 = time.perf_counter()
    for k in keys:
        sk(k)
        update(value() + 1)
    if changelog:
        job.writer.flush()
    dt = time.perf_counter() - t0
    b.close()
    return dt


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    updates, nkeys, rounds = (100_000, 10_000, 3) if quick else (1_000_000, 100_000, 7)
    state_keys, ckpt_rounds = (20_000, 2) if quick else (1_000_000, 3)
    tmp = None
    if root is None:
        tmp = tempfile.mkdtemp(prefix="statelog-bench-")
        root = Path(tmp).as_uri()
    try:
        rng = random.Random(42)
        keys = [rng.randrange(nkeys) for _ in range(updates)]
        job = statelog.open(root + "/updates" if root.startswith("s3://") else root.rstrip("/") + "/updates")
        t_log: list[float] = []
        t_heap: list[float] = []
        for r in range(rounds):
            t_heap.append(_updates(job, f"heap{r}", False, keys))
            t_log.append(_updates(job, f"log{r}", True, keys))
            _log(progress, f"round {r}: heap {updates / t_heap[-1]:,.0f}/s changelog {updates / t_log[-1]:,.0f}/s")
        job.close()
        heap_s, log_s = statistics.median(t_heap), statistics.median(t_log)
        # the ratio is taken per round (both variants measured back to back), then the median
        ratio = statistics.median(h / c for h, c in zip(t_heap, t_log, strict=True))

        job = statelog.open(root.rstrip("/") + "/checkpoints")
        b = job.backend("state")
        st = b.get_state(COUNT)
        for k in range(state_keys):
            b.set_current_key(k)
            st.update(k)
        job.checkpoint(sources={"offset": 0})
        changed = max(1, state_keys // 100)
        cl_times, cl_bytes, full_times, full_bytes = [], [], [], []
        for r in range(ckpt_rounds):
            for k in rng.sample(range(state_keys), changed):
                b.set_current_key(k)
                st.update(st.value() + 1)
            before = job.writer.bytes_uploaded
            t0 = time.perf_counter()
            meta = job.checkpoint(sources={"offset": r + 1})
            cl_times.append(time.perf_counter() - t0)
            meta_bytes = len(meta.to_bytes())
            cl_bytes.append(job.writer.bytes_uploaded - before + meta_bytes)
            t0 = time.perf_counter()
            nbytes = write_state_dump(b, job.store, bench_state_dump_key(str(r)))
            full_times.append(time.perf_counter() - t0)
            full_bytes.append(nbytes)
            _log(
                progress,
                f"checkpoint {r}: changelog {cl_times[-1] * 1000:.1f} ms {cl_bytes[-1]:,} B; "
                f"full snapshot {full_times[-1] * 1000:.1f} ms {full_bytes[-1]:,} B",
            )
        job.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    cl_t, cl_b = statistics.median(cl_times), statistics.median(cl_bytes)
    f_t, f_b = statistics.median(full_times), statistics.median(full_bytes)
    return {
        "updates": updates,
        "keys": nkeys,
        "updates_per_s_changelog": round(updates / log_s),
        "updates_per_s_no_changelog": round(updates / heap_s),
        "update_ratio": round(ratio, 3),
        "state_keys": state_keys,
        "changed_keys_per_checkpoint": changed,
        "checkpoint_ms_changelog": round(cl_t * 1000, 2),
        "checkpoint_ms_full_snapshot": round(f_t * 1000, 2),
        "checkpoint_bytes_changelog": cl_b,
        "checkpoint_bytes_full_snapshot": f_b,
        "checkpoint_bytes_ratio": round(f_b / cl_b, 1),
        "checkpoint_time_ratio": round(f_t / cl_t, 1),
        "rounds": rounds,
    }
