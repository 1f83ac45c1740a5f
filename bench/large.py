"""State larger than memory: the disk-backed working set against the in-memory one.

A keyed job with a value state (int64) and a small map state per key runs in its own
process per variant, so each process's peak RSS (``VmHWM``) is its own:

* ``disk``: ``state_store="disk"``, ``state_memory`` 512 MB, over ``keys`` keys (2×10^7);
* ``memory``: the in-memory store over the largest state that fits comfortably here
  (``keys / 10``), run before and after the disk variant (noise check).

Each variant loads every key once (in key order), then runs three rounds of a uniform and a
Zipf(1.1) phase (bounded Zipf over the keys, ranks scattered by a permutation; the parent
generates the key sequences into files, so their numpy temporaries are not counted in the
job's RSS), each a fixed number of records: ``set_current_key``, ``value() + 1`` update, one map put. The records
are processed in batches of :data:`BATCH`, as a consumer loop polls them, each preceded by
``prefetch`` of its keys (KeyedStateBackend.prefetch: one batched read of the keys not
resident on disk; a no-op in memory). A checkpoint is
taken every second of processing. Then the disk variant's last checkpoint is materialized by
``statelog materializer run --once`` in another process, the job takes one more checkpoint
(built on that materialization, with an empty tail) and a fresh process restores it
into the disk store (``restore_s``: until every key group is loaded, ``wait_loaded()``;
``restore_first_record_s``: until a first key's value is read; and its peak RSS). A ``sizing`` process measures
bytes per key of each state kind in memory (RSS growth) and on disk (database size after
a full compaction).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUNDS = 3
BATCH = 2048  # records per batch (a prefetch each); measured at 2x10^6 keys, 51 MB: 1,024-4,096 alike


def _rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _schedstat() -> tuple[int, int]:
    """This thread's nanoseconds on a CPU and waiting for one (runnable but not running), from
    ``/proc/thread-self/schedstat``; zeros where the kernel does not keep them."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on, wait = f.read().split()[:2]
        return int(on), int(wait)
    except (OSError, ValueError):
        return 0, 0


def _zipf_keys(n: int, count: int, seed: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** 1.1
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    perm = rng.permutation(n)
    return perm[np.searchsorted(cdf, rng.random(count))].tolist()


def _uniform_keys(n: int, count: int, seed: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(0, n, count).tolist()


def _open(root: str, store: str, memory: str) -> tuple[Any, Any, Any, Any]:
    import pyarrow as pa

    import statelog

    job = statelog.open(root, state_store=store, state_memory=memory)
    b = job.backend("op", restore="latest")
    v = b.get_state(statelog.ValueStateDescriptor("v", pa.int64(), default=0))
    m = b.get_state(statelog.MapStateDescriptor("m", key_type=pa.string(), value_type=pa.int64()))
    return job, b, v, m


def _sequence_path(seqdir: str, keys: int, r: int, dist: str) -> str:
    return os.path.join(seqdir, f"{dist}-{keys}-{r}.npy")


def write_sequences(seqdir: str, keys: int, records: int) -> None:
    """The key sequence of every phase, made by the parent: generating a Zipf sequence over
    2×10^7 keys takes ~0.5 GB of numpy temporaries, which is not the job's memory."""
    import numpy as np

    for r in range(ROUNDS):
        for dist in ("uniform", "zipf"):
            path = _sequence_path(seqdir, keys, r, dist)
            if not os.path.exists(path):
                seq = (_uniform_keys if dist == "uniform" else _zipf_keys)(keys, records, 100 * r + len(dist))
                np.save(path, np.asarray(seq, dtype=np.int64))


def child_job(store: str, keys: int, records: int, memory: str, root: str, seqdir: str) -> dict[str, Any]:
    import numpy as np

    job, b, v, m = _open(root, store, memory)
    names = ["a", "b", "c"]
    ckpt_ms: list[float] = []
    last = [time.monotonic()]

    def maybe_checkpoint(i: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0:
            t = time.perf_counter()
            job.checkpoint(sources={"i": i})
            ckpt_ms.append((time.perf_counter() - t) * 1000)
            last[0] = time.monotonic()

    set_key, value, update, put, prefetch = b.set_current_key, v.value, v.update, m.put, b.prefetch
    t0 = time.perf_counter()
    for k in range(keys):
        set_key(k)
        update(value() + 1)
        put("a", k)
        if not k & 4095:
            maybe_checkpoint(k)
    load_s = time.perf_counter() - t0
    rates: dict[str, list[float]] = {"uniform": [], "zipf": []}
    # the task thread's share of each phase on a CPU and waiting for one (the other threads,
    # the changelog's flusher and RocksDB's compactions, share the machine's cores with it)
    on_cpu: dict[str, list[float]] = {"uniform": [], "zipf": []}
    runq: dict[str, list[float]] = {"uniform": [], "zipf": []}
    for r in range(ROUNDS):
        for dist in ("uniform", "zipf"):
            seq = np.load(_sequence_path(seqdir, keys, r, dist)).tolist()
            s0 = _schedstat()
            t = time.perf_counter()
            for start in range(0, len(seq), BATCH):
                batch = seq[start : start + BATCH]
                prefetch(batch)
                for i, k in enumerate(batch, start):
                    set_key(k)
                    update(value() + 1)
                    put(names[i % 3], i)
                    if not i & 4095:
                        maybe_checkpoint(i)
            wall = time.perf_counter() - t
            s1 = _schedstat()
            rates[dist].append(records / wall)
            on_cpu[dist].append(round((s1[0] - s0[0]) / 1e9 / wall, 3))
            runq[dist].append(round((s1[1] - s0[1]) / 1e9 / wall, 3))
    t = time.perf_counter()
    job.checkpoint(sources={"i": -1})
    ckpt_ms.append((time.perf_counter() - t) * 1000)
    materialize_s = None
    if store == "disk":  # materialized by another process; the next checkpoint builds on it
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tools.cli", "materializer", "run", root, "--once",
                        "--max-tail-bytes", "1", "--no-gc"], check=True, capture_output=True)  # fmt: skip
        materialize_s = round(time.perf_counter() - t, 1)
        job.materialization_poll_s = 0
        job.checkpoint(sources={"i": -2})
    ws = b._ws
    out = {
        "load_keys_per_s": round(keys / load_s),
        "rates": rates,
        "on_cpu": on_cpu,
        "runq": runq,
        "checkpoint_ms": ckpt_ms,
        "disk_bytes": ws.disk_bytes() if ws is not None else 0,
        "cache": ws.stats() if ws is not None else None,
        "materialize_s": materialize_s,
    }
    job.close()
    out["peak_rss_mib"] = round(_rss_kib("VmHWM") / 1024, 1)
    return out


def child_restore(root: str, memory: str) -> dict[str, Any]:
    t = time.perf_counter()
    job, b, v, _m = _open(root, "disk", memory)
    b.set_current_key(12345)
    probe = v.value()
    first_s = time.perf_counter() - t
    b.wait_loaded()  # the whole state (restores are on demand by default)
    restore_s = time.perf_counter() - t
    stats = {k: b.restore_stats.get(k) for k in ("rows", "records", "bytes_read")}
    job.close()
    return {"restore_s": round(restore_s, 2), "first_record_s": round(first_s, 2),
            "peak_rss_mib": round(_rss_kib("VmHWM") / 1024, 1), "probe": probe,
            **stats}


def child_sizing(keys: int) -> dict[str, Any]:
    """Bytes per key of each state kind: RSS growth in memory, database size on disk."""
    import gc

    import pyarrow as pa

    import statelog

    kinds = {
        "value_int64": statelog.ValueStateDescriptor("s", pa.int64()),
        "list_3_int64": statelog.ListStateDescriptor("s", pa.int64()),
        "map_3_str_int64": statelog.MapStateDescriptor("s", key_type=pa.string(), value_type=pa.int64()),
        "reducing_int64": statelog.ReducingStateDescriptor("s", pa.int64(), reduce_fn=lambda a, b: a + b),
    }
    out: dict[str, Any] = {}
    for name, desc in kinds.items():
        for store in ("memory", "disk"):
            root = tempfile.mkdtemp(prefix="statelog-bench-sizing-")
            job = statelog.open(Path(root).as_uri(), state_store=store, state_memory="64MB")
            b = job.backend("op", changelog=False)
            st = b.get_state(desc)
            gc.collect()
            before = _rss_kib()
            for k in range(keys):
                b.set_current_key(k)
                if name.startswith("list"):
                    st.update([k, k + 1, k + 2])
                elif name.startswith("map"):
                    st.put_all({"a": k, "b": k + 1, "c": k + 2})
                elif name.startswith("reducing"):
                    st.add(k)
                else:
                    st.update(k)
            if store == "memory":
                gc.collect()
                out[f"{name}_memory_bytes_per_key"] = round((_rss_kib() - before) * 1024 / keys)
            else:
                ws = b._ws
                ws.flush()
                ws._db.flush()
                ws._db.compact_range(None, None)
                out[f"{name}_disk_bytes_per_key"] = round(ws.disk_bytes() / keys)
            job.close()
            shutil.rmtree(root, ignore_errors=True)
    return out


def _child(*argv: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "bench.large", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.large {argv[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 1) if xs else 0.0


def _slowest(xs: list[float], n: int = 5) -> list[float]:
    return [round(x, 1) for x in sorted(xs, reverse=True)[:n]]


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    keys = 200_000 if quick else 20_000_000
    mem_keys = keys // 10
    records = 100_000 if quick else 1_000_000
    memory = "512MB"
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-large-"))
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else (lambda s: None)
    try:
        disk_root = root or (work / "disk").as_uri()
        seqdir = str(work)
        say("key sequences ...")
        write_sequences(seqdir, mem_keys, records)
        write_sequences(seqdir, keys, records)
        results: dict[str, Any] = {}
        t0 = time.monotonic()
        say(f"memory store, {mem_keys:,} keys ...")
        mem1 = _child("job", "memory", str(mem_keys), str(records), memory, (work / "mem1").as_uri(), seqdir)
        say(f"disk store, {keys:,} keys, state_memory {memory} ...")
        disk = _child("job", "disk", str(keys), str(records), memory, disk_root, seqdir)
        say("memory store again ...")
        mem2 = _child("job", "memory", str(mem_keys), str(records), memory, (work / "mem2").as_uri(), seqdir)
        say("restoring the last checkpoint into the disk store (another process) ...")
        restored = _child("restore", disk_root, memory)
        say("sizing ...")
        sizing = _child("sizing", str(20_000 if quick else 200_000))
        for dist in ("uniform", "zipf"):
            d = disk["rates"][dist]
            mem = mem1["rates"][dist] + mem2["rates"][dist]
            ratios = [x / statistics.median(mem) for x in d]
            results[f"updates_per_s_disk_{dist}"] = round(statistics.median(d))
            results[f"updates_per_s_disk_{dist}_spread"] = [round(min(d)), round(max(d))]
            results[f"updates_per_s_memory_{dist}"] = round(statistics.median(mem))
            results[f"updates_per_s_memory_{dist}_spread"] = [round(min(mem)), round(max(mem))]
            results[f"ratio_{dist}"] = round(statistics.median(ratios), 3)
            # per phase: the task thread's share of the phase on a CPU and waiting for one
            results[f"task_thread_on_cpu_{dist}"] = {"disk": disk["on_cpu"][dist],
                                                     "memory": mem1["on_cpu"][dist] + mem2["on_cpu"][dist]}
            results[f"task_thread_runq_{dist}"] = {"disk": disk["runq"][dist],
                                                   "memory": mem1["runq"][dist] + mem2["runq"][dist]}
        results.update(
            keys=keys, memory_keys=mem_keys, records_per_phase=records, rounds=ROUNDS, state_memory=memory,
            peak_rss_mib=disk["peak_rss_mib"], peak_rss_mib_memory_store=max(mem1["peak_rss_mib"], mem2["peak_rss_mib"]),
            checkpoint_p99_ms=_p99(disk["checkpoint_ms"]), checkpoint_p99_ms_memory=_p99(
                mem1["checkpoint_ms"] + mem2["checkpoint_ms"]),
            # the five slowest, so that a p99 moved by a few outliers shows them
            checkpoint_slowest_ms=_slowest(disk["checkpoint_ms"]),
            checkpoint_slowest_ms_memory=_slowest(mem1["checkpoint_ms"] + mem2["checkpoint_ms"]),
            checkpoints=len(disk["checkpoint_ms"]), load_keys_per_s_disk=disk["load_keys_per_s"],
            restore_s=restored["restore_s"], restore_first_record_s=restored["first_record_s"],
            restore_peak_rss_mib=restored["peak_rss_mib"],
            restore_rows=restored["rows"], restore_records=restored["records"],
            materialize_s=disk["materialize_s"], disk_bytes=disk["disk_bytes"],
            disk_bytes_per_key=round(disk["disk_bytes"] / keys, 1), cache=disk["cache"], sizing=sizing,
            total_s=round(time.monotonic() - t0, 1),
        )  # fmt: skip
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.large")
    p.add_argument("what", choices=["job", "restore", "sizing"])
    p.add_argument("args", nargs="*")
    a = p.parse_args()
    if a.what == "job":
        store, keys, records, memory, root, seqdir = a.args
        out = child_job(store, int(keys), int(records), memory, root, seqdir)
    elif a.what == "restore":
        out = child_restore(*a.args)
    else:
        out = child_sizing(int(a.args[0]))
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
