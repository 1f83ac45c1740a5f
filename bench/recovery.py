"""Recovery: eager vs on-demand restore, time to the first record, to fully loaded, and memory.

``python -m bench.recovery --json [--sizes 1000000,10000000] [--rounds 9] [--no-s3]``

For each store (a ``file://`` root and a SeaweedFS ``s3://`` root started here) and each state
size, a ``ValueState<int64>`` of N int keys is written, checkpointed, materialized, and 1 % of
the keys are changed after it (the tail), then checkpointed again (checkpoint A, parallelism
1). A checkpoint B at parallelism 2 is taken by two backends restored on demand from A
without touching a key (their handles reference A's files and tail, nothing is rewritten).

Each measurement runs in a fresh process (so its peak RSS is its own):

* ``restore``: one backend at parallelism 1 restores A;
* ``rescale``: subtask 1 of 3 restores B (2 -> 3: its key groups come from both old subtasks).

and reports ``first_record_s`` (from ``statelog.open`` to the value of a random key read),
``fully_loaded_s`` (to every key group loaded: ``wait_loaded()``), ``peak_rss_mib`` (the
process's maximum RSS) and ``loaded_mib`` (RSS after the load minus RSS before the open: the
loaded state; ``live_mib`` the same after the allocators gave back the memory they keep
free, the state's own size, and ``peak_over_live``). Eager and on-demand alternate within each round; medians over the rounds are
reported with their spread, and the ratios on-demand / eager side by side: the median of
the per-round ratios (``_ratio_``) and the ratio of the medians (``_ratio_of_medians_``).
States of up to ``SMALL`` keys get twice the rounds: their loads take 0.1-0.5 s, where this
machine's noise (+-30 %) weighs most, and their rounds are cheap. ``cpu_s`` is the process's
CPU time from the open to fully loaded (every thread).

``python -m bench recovery --json --local-copies [--sizes ...] [--rounds 5] [--no-s3]`` runs
:mod:`bench.local_copies`: restores with this host's local copies of what it wrote against
restores from the store, on ``file://``, SeaweedFS and SeaweedFS behind a throttle (20 ms per
request, 50 MB/s); ``local_copies_speedup_<case>`` is the remote fully-loaded time over the
local one for each throttled case.

``python -m bench.recovery --json --small-tail [--rounds 9] [--no-s3]`` measures instead a
tail of many small segments: ``SMALL_TAIL_CHECKPOINTS`` checkpoints of
``SMALL_TAIL_UPDATES`` updates each (a segment each, no materialization) over
``SMALL_TAIL_KEYS`` keys; a restore then reads ``SMALL_TAIL_TOUCHED`` random keys one after
the other (``touched_s``, from the open) and waits for the rest (``fully_loaded_s``), eager
and on demand alternately, each in a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIZES = (1_000_000, 10_000_000)
SMALL = 1_000_000  # states up to this many keys get twice the rounds
QUICK_SIZES = (20_000, 100_000)
TAIL_SHARE = 0.01
UID = "counter"
SMALL_TAIL_KEYS = 2000
SMALL_TAIL_CHECKPOINTS = 60
SMALL_TAIL_UPDATES = 200
SMALL_TAIL_TOUCHED = 200


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_rss_mib() -> float:
    """This process's peak RSS (``VmHWM``; ``ru_maxrss`` would include the parent's peak,
    since it survives ``exec``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _descriptor() -> Any:
    import pyarrow as pa

    from statelog import ValueStateDescriptor

    return ValueStateDescriptor("count", pa.int64(), default=0)


def build(root: str, options: dict[str, Any], n: int, progress: bool) -> dict[str, int]:
    """Write the state; return the ids of checkpoints A (parallelism 1) and B (parallelism 2)."""
    import statelog
    from materializer.build import materialize

    desc = _descriptor()
    t0 = time.monotonic()
    with statelog.open(root, store_options=options, writer_options={"max_buffered_records": 1 << 20}) as job:
        b = job.backend(UID)
        state = b.get_state(desc)
        for k in range(n):
            b.set_current_key(k)
            state.update(k)
        first = job.checkpoint()
        materialize(job.store, first)
        rng = random.Random(1)
        for k in rng.sample(range(n), int(n * TAIL_SHARE)):
            b.set_current_key(k)
            state.update(-k)
        a = job.checkpoint().checkpoint_id
    if progress:
        print(f"  built {n:,} keys on {root.split(':')[0]} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    with statelog.open(root, store_options=options, create=False, on_demand_restore=True) as job:
        job.on_demand_background = False  # nothing is loaded: the handles are A's, restricted
        for i in range(2):
            job.backend(UID, subtask=i, parallelism=2, restore=a).get_state(desc)
        b_id = job.checkpoint().checkpoint_id
    return {"A": a, "B": b_id}


def measure(root: str, options: dict[str, Any], checkpoint: int, subtask: int, parallelism: int,
            on_demand: bool, key: int) -> dict[str, float]:  # fmt: skip
    """One restore in this process (run it in a fresh one). The modules a restore uses are
    imported first (a restarted worker has them loaded before it restores): the figures are
    the restore's, not the interpreter's first imports (about 0.5 s for the S3 client)."""
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401

    import statelog
    import statelog.job  # noqa: F401  (``statelog.open`` loads the engine lazily: loaded here, not timed)
    import statelog.restore.ondemand.loader  # noqa: F401
    import statelog.store.local  # noqa: F401
    import statelog.store.s3.object_store  # noqa: F401

    pa.array([0])  # pyarrow's first array imports pandas when it is installed (0.2 s): not the restore's
    desc = _descriptor()
    gc.collect()
    before = _rss_mib()
    t0, c0 = time.perf_counter(), time.process_time()
    job = statelog.open(root, store_options=options, create=False, on_demand_restore=on_demand)
    b = job.backend(UID, subtask=subtask, parallelism=parallelism, restore=checkpoint, changelog=False)
    state = b.get_state(desc)
    b.set_current_key(key)
    value = state.value()
    first = time.perf_counter() - t0
    b.wait_loaded()
    full = time.perf_counter() - t0
    cpu = time.process_time() - c0
    gc.collect()
    after = _rss_mib()
    assert value in (key, -key), (key, value)
    peak = _peak_rss_mib()
    live = _release_free_memory() - before
    job.close()
    return {"first_record_s": first, "fully_loaded_s": full, "cpu_s": cpu, "peak_rss_mib": peak,
            "loaded_mib": after - before, "peak_over_loaded": (peak - before) / max(after - before, 1e-9),
            "live_mib": live, "peak_over_live": (peak - before) / max(live, 1e-9)}  # fmt: skip


def build_small_tail(root: str, options: dict[str, Any]) -> int:
    """A tail of ``SMALL_TAIL_CHECKPOINTS`` small segments; the last checkpoint's id."""
    import statelog

    desc = _descriptor()
    rng = random.Random(2)
    with statelog.open(root, store_options=options) as job:
        b = job.backend(UID)
        state = b.get_state(desc)
        for c in range(SMALL_TAIL_CHECKPOINTS):
            for _ in range(SMALL_TAIL_UPDATES):
                b.set_current_key(rng.randrange(SMALL_TAIL_KEYS))
                state.update(c)
            last = job.checkpoint()
    return last.checkpoint_id


def measure_touches(root: str, options: dict[str, Any], checkpoint: int, on_demand: bool) -> dict[str, float]:
    """Open at ``checkpoint``, read ``SMALL_TAIL_TOUCHED`` random keys, wait for the rest."""
    import pyarrow as pa
    import pyarrow.parquet  # noqa: F401

    import statelog
    import statelog.job  # noqa: F401  (``statelog.open`` loads the engine lazily: loaded here, not timed)
    import statelog.restore.ondemand.loader  # noqa: F401
    import statelog.store.local  # noqa: F401
    import statelog.store.s3.object_store  # noqa: F401

    pa.array([0])  # pyarrow's first array imports pandas when it is installed (0.2 s): not the restore's
    desc = _descriptor()
    keys = random.Random(3).sample(range(SMALL_TAIL_KEYS), SMALL_TAIL_TOUCHED)
    t0 = time.perf_counter()
    job = statelog.open(root, store_options=options, create=False, on_demand_restore=on_demand)
    b = job.backend(UID, restore=checkpoint, changelog=False)
    state = b.get_state(desc)
    values = []
    for k in keys:
        b.set_current_key(k)
        values.append(state.value())
    touched = time.perf_counter() - t0
    b.wait_loaded()
    full = time.perf_counter() - t0
    assert all(v is not None and 0 <= v < SMALL_TAIL_CHECKPOINTS for v in values), values
    job.close()
    return {"touched_s": touched, "fully_loaded_s": full}


def run_small_tail(rounds: int, s3: bool, progress: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"small_tail": {"keys": SMALL_TAIL_KEYS, "checkpoints": SMALL_TAIL_CHECKPOINTS,
                                             "updates": SMALL_TAIL_UPDATES, "touched": SMALL_TAIL_TOUCHED},
                              "rounds": rounds}  # fmt: skip
    with _stores(None, s3) as stores:
        for store, url, options in stores:
            cid = build_small_tail(url, options)
            runs: dict[str, list[dict[str, float]]] = {"eager": [], "on_demand": []}
            for r in range(rounds):
                for mode in (("eager", "on_demand") if r % 2 == 0 else ("on_demand", "eager")):
                    runs[mode].append(_child(["touches", url, json.dumps(options), str(cid),
                                              "1" if mode == "on_demand" else "0"]))  # fmt: skip
                    if progress:
                        print(f"  {store} small tail {mode}: {runs[mode][-1]}", file=sys.stderr)
            for metric in ("touched_s", "fully_loaded_s"):
                for mode, ms in runs.items():
                    result[f"{store}_small_tail_{mode}_{metric}"] = _median([m[metric] for m in ms])
                ratios = [o[metric] / e[metric] for o, e in zip(runs["on_demand"], runs["eager"], strict=True)]
                result[f"{store}_small_tail_ratio_{metric}"] = _median(ratios)
    return result


@contextlib.contextmanager
def _stores(root: str | None, s3: bool) -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    """``(name, root URL, store options)`` of a ``file://`` root (``root`` or a new one) and,
    with ``s3``, of a SeaweedFS ``s3://`` root started here; at the end the server is stopped
    and the new roots deleted (a 10^7-key run leaves about 1 GB)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    stores: list[tuple[str, str, dict[str, Any]]] = [("file", root or (tmp / "file").as_uri(), {})]
    server = None
    try:
        if s3:
            from tests.support.s3server import start_seaweedfs

            server = start_seaweedfs(tmp / "s3")
            spec = server.unique_root()
            stores.append(("s3", spec.url, dict(spec.options)))
        yield stores
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # (a root given by the caller is not in it)


def _release_free_memory() -> float:
    """RSS after the allocators gave back the memory they keep free for reuse (Arrow's pool,
    glibc's arenas): the loaded state's own size, which ``loaded_mib`` overstates by what the
    allocators happened to keep (tens of MiB, varying from run to run)."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")
    if libc:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc).malloc_trim(0)
    return _rss_mib()


def _child(args: list[str]) -> dict[str, float]:
    """``python -m bench.recovery measure|touches ...`` in a fresh process: its figures."""
    out = subprocess.run([sys.executable, "-m", "bench.recovery", *args], capture_output=True, text=True,
                         timeout=3600)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def run(quick: bool = False, root: str | None = None, progress: bool = True, sizes: tuple[int, ...] | None = None,
        rounds: int = 9, s3: bool = True, local_copies: bool = True) -> dict[str, Any]:  # fmt: skip
    import statelog
    from bench import local_copies as copies_bench  # it imports this module's helpers

    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    result: dict[str, Any] = {"sizes": list(sizes), "rounds": rounds, "tail_share": TAIL_SHARE}
    if local_copies:  # local copies vs the store, file://, SeaweedFS and SeaweedFS throttled
        copies = copies_bench.run(quick=quick, root=root, progress=progress, sizes=sizes,
                                  rounds=min(rounds, copies_bench.ROUNDS), s3=s3)  # fmt: skip
        result.update({k if k.startswith("local_copies_") else f"local_copies_{k}": v for k, v in copies.items()})
    with _stores(root, s3) as stores:
        for store, base, options in stores:
            for n in sizes:
                url = f"{base.rstrip('/')}/n{n}"
                ids = build(url, options, n, progress)
                key = random.Random(n).randrange(n)
                cases = {
                    "restore": (ids["A"], 0, 1),
                    "rescale_2_to_3": (ids["B"], 1, 3),
                }
                for case, (cid, subtask, par) in cases.items():
                    # a key of the subtask's key groups
                    k = next(x for x in range(key, key + 10_000)
                             if statelog.subtask_for_key_group(128, par, statelog.key_group_of(x, 128)) == subtask)  # fmt: skip
                    runs: dict[str, list[dict[str, float]]] = {"eager": [], "on_demand": []}
                    for r in range(rounds * (2 if n <= SMALL else 1)):
                        order = ("eager", "on_demand") if r % 2 == 0 else ("on_demand", "eager")
                        for mode in order:
                            args = [url, json.dumps(options), str(cid), str(subtask), str(par),
                                    "1" if mode == "on_demand" else "0", str(k)]  # fmt: skip
                            runs[mode].append(_child(["measure", *args]))
                            if progress:
                                m = runs[mode][-1]
                                print(f"  {store} n={n:,} {case} {mode}: first {m['first_record_s']:.3f}s, full "
                                      f"{m['fully_loaded_s']:.2f}s, peak {m['peak_rss_mib']:.0f} MiB, loaded "
                                      f"{m['loaded_mib']:.0f} MiB", file=sys.stderr)  # fmt: skip
                    prefix = f"{store}_n{n}_{case}"
                    for mode, ms in runs.items():
                        for metric in ("first_record_s", "fully_loaded_s", "cpu_s", "peak_rss_mib", "loaded_mib",
                                       "peak_over_loaded", "live_mib", "peak_over_live"):  # fmt: skip
                            result[f"{prefix}_{mode}_{metric}"] = _median([m[metric] for m in ms])
                    result[f"{prefix}_rounds"] = len(runs["eager"])
                    for metric in ("first_record_s", "fully_loaded_s", "cpu_s", "peak_rss_mib"):
                        ratios = [o[metric] / e[metric] for o, e in zip(runs["on_demand"], runs["eager"], strict=True)]
                        result[f"{prefix}_ratio_{metric}"] = _median(ratios)
                        result[f"{prefix}_ratio_of_medians_{metric}"] = round(
                            result[f"{prefix}_on_demand_{metric}"]["median"] / result[f"{prefix}_eager_{metric}"]["median"], 4)
    return result


def main(argv: list[str]) -> int:
    if argv and argv[0] == "measure":
        root, options, cid, subtask, par, on_demand, key = argv[1:]
        print(json.dumps(measure(root, json.loads(options), int(cid), int(subtask), int(par), on_demand == "1", int(key))))
        return 0
    if argv and argv[0] == "touches":
        root, options, cid, on_demand = argv[1:]
        print(json.dumps(measure_touches(root, json.loads(options), int(cid), on_demand == "1")))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.recovery")
    p.add_argument("--sizes", default=None, help="comma-separated key counts (default 1000000,10000000)")
    p.add_argument("--rounds", type=int, default=9, help="rounds per case (twice as many for small states)")
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--small-tail", action="store_true", help="a tail of many small segments, keys read one by one")
    p.add_argument("--local-copies", action="store_true",
                   help="restores with local copies fully loaded vs without (bench/local_copies.py), S3 also throttled")
    a = p.parse_args(argv)
    if a.local_copies:
        from bench import local_copies  # bench.local_copies imports this module's helpers

        sizes = tuple(int(x) for x in a.sizes.split(",")) if a.sizes else None
        result = local_copies.run(quick=a.quick, progress=not a.json, rounds=a.rounds, sizes=sizes, s3=not a.no_s3)
        print(json.dumps(result, sort_keys=True) if a.json else json.dumps(result, indent=1, sort_keys=True))
        return 0
    if a.small_tail:
        result = run_small_tail(a.rounds, not a.no_s3, not a.json)
        print(json.dumps(result, sort_keys=True) if a.json else json.dumps(result, indent=1, sort_keys=True))
        return 0
    sizes = tuple(int(x) for x in a.sizes.split(",")) if a.sizes else None
    result = run(quick=a.quick, progress=not a.json, sizes=sizes, rounds=a.rounds, s3=not a.no_s3)
    print(json.dumps(result, sort_keys=True) if a.json else json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
