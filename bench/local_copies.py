"""Task-local recovery: a restore from local copies against one from the store, side by side.

``python -m bench local_copies --json [--quick]`` (also ``python -m bench.recovery
--local-copies``). For each store (a ``file://`` root and a SeaweedFS ``s3://`` root started
here), a ``ValueState<int64>`` of N int keys (0..N-1; the largest N also random ids) is
written through a :class:`~statelog.store.local_copies.LocalCopyStore` (so this host has
copies of everything it wrote, and table images of its tables), checkpointed, materialized
(tables written through the same copies), 1 % of the keys changed, checkpointed again.
Then, in fresh processes and alternating within each round, a backend restores that
checkpoint:

* ``remote``: without local copies (every object from the store);
* ``local``: with the copies directory the writer filled.

On S3 both also run behind a throttle (``THROTTLE_LATENCY_S`` per request and
``THROTTLE_BYTES_PER_S``, the figures are in the output), which is what a remote object
store across a network costs and SeaweedFS on loopback does not. Reported per store, size
and mode: ``first_record_s`` (on-demand restore, a random key read), ``fully_loaded_s``
(eager restore), the objects and bytes read locally and remotely, medians over rounds with
their spread, the per-round ratios remote/local, and the copies' disk footprint against
their budget.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.recovery import _descriptor, _stores
from statelog.store import open_store
from statelog.store.base import ObjectInfo, ObjectStore

SIZES = (1_000_000, 10_000_000)
QUICK_SIZES = (20_000,)
ROUNDS = 5
TAIL_SHARE = 0.01
UID = "counter"
THROTTLE_LATENCY_S = 0.020
THROTTLE_BYTES_PER_S = 50_000_000
BUDGET_BYTES = 4 << 30


class ThrottledStore(ObjectStore):
    """A store that costs what a remote object store does: ``latency_s`` per request and a
    bandwidth limit shared by all its reads (the link is busy until the bytes are through)."""

    def __init__(self, inner: ObjectStore, latency_s: float, bytes_per_s: float) -> None:
        self.inner, self.latency_s, self.bytes_per_s = inner, latency_s, bytes_per_s
        self.url = inner.url
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the link is free again

    def _transfer(self, n: int) -> None:
        time.sleep(self.latency_s)
        with self._lock:
            self._free_at = max(time.monotonic(), self._free_at) + n / self.bytes_per_s
            wait = self._free_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        self._transfer(len(data))
        return data

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        data = self.inner.get_range(key, offset, length)
        self._transfer(len(data))
        return data

    def put(self, key: str, data: bytes) -> None:
        self._transfer(len(data))
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._transfer(len(data))
        return self.inner.put_if_absent(key, data)

    def head(self, key: str) -> ObjectInfo | None:
        self._transfer(0)
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._transfer(0)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._transfer(0)
        self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()


def _throttled_store(root: str, options: dict[str, Any]) -> ThrottledStore:
    return ThrottledStore(open_store(root, options), THROTTLE_LATENCY_S, THROTTLE_BYTES_PER_S)


def state_keys(n: int, keys: str) -> list[int]:
    """The ``n`` keys of a case: ``"sequential"`` 0..n-1 (the table files compress to about
    4 bytes a row), ``"random"`` distinct random ints below 2^62 in magnitude (ids: about 16
    bytes a row, keys and values alike incompressible)."""
    if keys == "sequential":
        return list(range(n))
    rng, out = random.Random(n), set()
    while len(out) < n:
        out.add(rng.randrange(-(1 << 62), 1 << 62))
    return sorted(out)


def build(root: str, options: dict[str, Any], n: int, copies: Path, keys: str = "sequential") -> int:
    """Write the state (key k: value k, then -k for the tail's keys) through local copies in
    ``copies``; return the checkpoint's id."""
    import statelog
    from materializer.build import materialize

    desc = _descriptor()
    setting = {"directory": str(copies), "budget_bytes": BUDGET_BYTES}
    ks = state_keys(n, keys)
    with statelog.open(root, store_options=options, local_copies=setting,
                       writer_options={"max_buffered_records": 1 << 20}) as job:  # fmt: skip
        b = job.backend(UID)
        state = b.get_state(desc)
        for k in ks:
            b.set_current_key(k)
            state.update(k)
        materialize(job.store, job.checkpoint())
        for k in random.Random(1).sample(ks, int(n * TAIL_SHARE)):
            b.set_current_key(k)
            state.update(-k)
        return job.checkpoint().checkpoint_id


def measure(root: str, options: dict[str, Any], checkpoint: int, on_demand: bool, key: int,
            copies: str, throttled: bool) -> dict[str, float]:  # fmt: skip
    """One restore in this process (run it in a fresh one)."""
    import pyarrow.parquet  # noqa: F401

    import statelog
    import statelog.restore.ondemand.loader  # noqa: F401
    import statelog.store.s3.object_store  # noqa: F401

    desc = _descriptor()
    setting = {"directory": copies, "budget_bytes": BUDGET_BYTES} if copies else None
    t0 = time.perf_counter()
    store = _throttled_store(root, options) if throttled else None
    job = statelog.open(root, store_options=None if throttled else options, store=store, create=False,
                        on_demand_restore=on_demand, writer_lease=False, local_copies=setting)  # fmt: skip
    b = job.backend(UID, restore=checkpoint, changelog=False)
    b.set_current_key(key)
    value = b.get_state(desc).value()
    first = time.perf_counter() - t0
    b.wait_loaded()
    full = time.perf_counter() - t0
    assert value in (key, -key), (key, value)
    st = job.local_copies.stats if job.local_copies is not None else None
    job.close()
    if store is not None:
        store.close()
    return {"first_record_s": first, "fully_loaded_s": full,
            "objects_local": st.hits if st else 0, "objects_remote": st.misses if st else -1,
            "bytes_local": st.bytes_local if st else 0, "bytes_remote": st.bytes_remote if st else -1}  # fmt: skip


def _child(args: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "bench.local_copies", "measure", *args], capture_output=True,
                         text=True, timeout=3600)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"measurement failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}


def run(quick: bool = False, root: str | None = None, progress: bool = True, rounds: int | None = None,
        sizes: tuple[int, ...] | None = None, s3: bool = True) -> dict[str, Any]:  # fmt: skip
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    rounds = rounds or (2 if quick else ROUNDS)
    result: dict[str, Any] = {
        "sizes": list(sizes), "rounds": rounds, "tail_share": TAIL_SHARE,
        "throttle": {"latency_s": THROTTLE_LATENCY_S, "bytes_per_s": THROTTLE_BYTES_PER_S, "applies_to": "s3"},
    }  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench-local-copies-"))
    try:
        with _stores(root, s3) as stores:
            # the largest size also with random keys (ids): the files do not compress, so the
            # transfer a copy saves is 4x larger than with sequential keys
            cases = [(n, "sequential") for n in sizes] + ([(max(sizes), "random")] if not quick else [])
            for store, base, options in stores:
                for n, keys in cases:
                    tag = "" if keys == "sequential" else f"_{keys}"
                    url = f"{base.rstrip('/')}/copies-n{n}{tag}"
                    copies = tmp / f"{store}-{n}{tag}"
                    t0 = time.monotonic()
                    cid = build(url, options, n, copies, keys)
                    if progress:
                        print(f"  built {n:,} {keys} keys on {store} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
                    footprint = sum(p.stat().st_size for p in copies.rglob("*") if p.is_file())
                    key = random.Random(n).choice(state_keys(n, keys))
                    variants = [("", False), ("", True)] if store == "s3" else [("", False)]
                    for label, throttled in ((("throttled" if t else "plain"), t) for _, t in variants):
                        runs: dict[str, list[dict[str, float]]] = {}
                        for r in range(rounds):
                            modes = ("remote", "local") if r % 2 == 0 else ("local", "remote")
                            for mode in modes:
                                for on_demand in (False, True):
                                    args = [url, json.dumps(options), str(cid), "1" if on_demand else "0", str(key),
                                            str(copies) if mode == "local" else "", "1" if throttled else "0"]  # fmt: skip
                                    m = _child(args)
                                    runs.setdefault(f"{mode}_{'on_demand' if on_demand else 'eager'}", []).append(m)
                                    if progress:
                                        print(f"  {store} {label}{tag} n={n:,} {mode} {'on-demand' if on_demand else 'eager'}: "
                                              f"first {m['first_record_s']:.3f}s full {m['fully_loaded_s']:.3f}s "
                                              f"remote objects {m['objects_remote']}", file=sys.stderr)  # fmt: skip
                        prefix = f"{store}_{label}_n{n}{tag}"
                        result[f"{prefix}_local_fully_loaded_s"] = _median([m["fully_loaded_s"] for m in runs["local_eager"]])
                        result[f"{prefix}_remote_fully_loaded_s"] = _median([m["fully_loaded_s"] for m in runs["remote_eager"]])
                        result[f"{prefix}_local_first_record_s"] = _median([m["first_record_s"] for m in runs["local_on_demand"]])
                        result[f"{prefix}_remote_first_record_s"] = _median([m["first_record_s"] for m in runs["remote_on_demand"]])
                        if throttled:  # the headline figure: remote fully-loaded time / local
                            result[f"local_copies_speedup_{prefix}"] = round(
                                result[f"{prefix}_remote_fully_loaded_s"]["median"]
                                / max(result[f"{prefix}_local_fully_loaded_s"]["median"], 1e-9), 2)
                        result[f"{prefix}_ratio_remote_over_local_fully_loaded"] = _median(
                            [r["fully_loaded_s"] / max(lo["fully_loaded_s"], 1e-9)
                             for r, lo in zip(runs["remote_eager"], runs["local_eager"], strict=True)])  # fmt: skip
                        result[f"{prefix}_ratio_remote_over_local_first_record"] = _median(
                            [r["first_record_s"] / max(lo["first_record_s"], 1e-9)
                             for r, lo in zip(runs["remote_on_demand"], runs["local_on_demand"], strict=True)])  # fmt: skip
                        local_runs = runs["local_eager"] + runs["local_on_demand"]
                        result[f"{prefix}_local_objects_remote_max"] = max(m["objects_remote"] for m in local_runs)
                        result[f"{prefix}_local_objects_local_median"] = statistics.median(m["objects_local"] for m in local_runs)
                    result[f"{store}_n{n}{tag}_copies_bytes"] = footprint
                    result[f"{store}_n{n}{tag}_copies_budget_bytes"] = BUDGET_BYTES
                    shutil.rmtree(copies, ignore_errors=True)  # (the next case's copies in its own budget)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main(argv: list[str]) -> int:
    if argv and argv[0] == "measure":
        root, options, cid, on_demand, key, copies, throttled = argv[1:]
        print(json.dumps(measure(root, json.loads(options), int(cid), on_demand == "1", int(key), copies,
                                 throttled == "1")))  # fmt: skip
        return 0
    quick = "--quick" in argv
    result = run(quick=quick, progress="--json" not in argv)
    print(json.dumps(result, sort_keys=True) if "--json" in argv else json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
