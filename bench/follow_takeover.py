"""The hot standby's takeover, for ``python -m bench follow`` (figures ``takeover_*``).

Per key count and round, a writer process (spawned) writes ``keys`` int keys of a
``ValueState<int64>`` and checkpoints; in this process a hot standby
(``statelog.open(root, standby=True)``, in a thread) follows the root and is fully loaded
(it logs "following"); then the writer's lease frees:

* ``release``: the writer closes cleanly; the lease is free when its ``released`` object is
  written (its mtime, the file store's clock: this machine's);
* ``kill``: the writer is SIGKILLed; the standby is on the same host, so the lease is free as
  soon as the process is gone (on another host: one ``writer_lease_ttl_s`` after its last
  renewal, plus this figure); the figure counts from the kill.

``takeover_first_record_s_<keys>_<mode>`` is the time from then to the first record
processed by the standby (``backend(...)``, ``set_current_key``, ``update``); it is fully
loaded at that point (``takeover_loaded_s_...``: the same moment). Against, on the same root
once the standby closed: a cold process's on-demand restore (``cold_ondemand_first_record_s_<keys>``,
``cold_ondemand_loaded_s_<keys>`` after ``wait_loaded()``) and an eager restore
(``eager_first_record_s_<keys>``, fully loaded at its first record), each from the moment it
opens the root (the lease is free). ``takeover_first_record_s_<keys>`` is the worse of the two modes;
``takeover_lease_s_<keys>_<mode>`` the part of it until the standby held the lease.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import statelog
from bench.follow_seed import UID, VALUE, seed
from statelog.layout import WRITER_LEASE_PREFIX

# the writer's lease ttl: the default. Neither mode waits for it on one host (a clean close
# releases the lease, a dead process's lease is free at once), and writing 10^7 keys holds
# the GIL in single calls (a dict's resize) long enough to miss a 2 s ttl's renewals
TTL_S = 10.0


def _writer(root: str, keys: int, ready: Any, go: Any) -> None:
    job = statelog.open(root, writer_lease_ttl_s=TTL_S)
    seed(job, keys)
    ready.set()
    go.wait(3600)
    job.close()


class _Following(logging.Handler):
    """Set when the standby logs that it follows (its follower restored, fully loaded)."""

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("standby of") and "following" in record.getMessage():
            self.event.set()


def _first_record(job: statelog.StateJob, on_demand: bool | None = None) -> tuple[float, statelog.KeyedStateBackend]:
    b = job.backend(UID, restore="latest", on_demand=on_demand)
    st = b.get_state(VALUE)
    b.set_current_key(12345)
    st.update(st.value() + 1)
    return time.time(), b


def _released_at(root: str) -> float:
    with statelog.open(root, writer_lease=False) as job:
        return max(o.mtime for o in job.store.list(WRITER_LEASE_PREFIX) if o.key.endswith(".released"))


def _takeover(root: str, keys: int, mode: str) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_writer, args=(root, keys, ready, go))
    proc.start()
    handler = _Following()
    logger = logging.getLogger("statelog.following.standby")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    out: dict[str, Any] = {}
    try:
        if not ready.wait(3600):
            raise RuntimeError("the writer did not checkpoint in time")

        def standby() -> None:
            job = statelog.open(root, standby=True)
            out["first"], out["backend"] = _first_record(job)
            out["job"] = job

        t = threading.Thread(target=standby, daemon=True)
        t.start()
        if not handler.event.wait(3600):
            raise RuntimeError("the standby did not follow in time")
        if mode == "kill":
            freed = time.time()
            os.kill(proc.pid, signal.SIGKILL)
        else:
            go.set()
        t.join(3600)
        proc.join(60)
        if mode == "release":
            freed = _released_at(root)
        job = out["job"]
        assert out["backend"].restore_stats.get("standby") is True
        job.close(flush=False)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        if proc.is_alive():
            proc.kill()
    return {"first": out["first"] - freed, "acquired": job.takeover.acquired_at - freed}


def _cold(root: str, on_demand: bool) -> tuple[float, float]:
    t0 = time.time()
    with statelog.open(root) as job:
        first, b = _first_record(job, on_demand=on_demand)
        b.wait_loaded()
        return first - t0, time.time() - t0


def _summary(values: list[float]) -> tuple[float, float]:
    med = statistics.median(values)
    return round(med, 4), round((max(values) - min(values)) / med, 3) if med else 0.0


def run(keys_list: list[int], rounds: int, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    """The takeover figures for each key count of ``keys_list`` (medians over ``rounds``, with spreads)."""
    out: dict[str, Any] = {}
    for keys in keys_list:
        samples: dict[str, list[float]] = {}
        for i in range(rounds):
            for mode in ("release", "kill"):
                with tempfile.TemporaryDirectory(prefix="bench-takeover-") as tmp:
                    r = (root.rstrip("/") + f"/takeover-{keys}-{mode}-{i}-{time.time_ns()}" if root
                         else (Path(tmp) / "root").as_uri())  # fmt: skip
                    took = _takeover(r, keys, mode)
                    samples.setdefault(f"takeover_first_record_s_{keys}_{mode}", []).append(took["first"])
                    samples.setdefault(f"takeover_lease_s_{keys}_{mode}", []).append(took["acquired"])
                    if mode == "release":  # the cold restores, on the same root
                        first, loaded = _cold(r, on_demand=True)
                        samples.setdefault(f"cold_ondemand_first_record_s_{keys}", []).append(first)
                        samples.setdefault(f"cold_ondemand_loaded_s_{keys}", []).append(loaded)
                        first, _loaded = _cold(r, on_demand=False)
                        samples.setdefault(f"eager_first_record_s_{keys}", []).append(first)
            if progress:
                print(f"takeover {keys} keys, round {i + 1}/{rounds}: "
                      f"{ {k: round(v[-1], 4) for k, v in samples.items()} }", flush=True)
        for name, values in samples.items():
            out[name], out[name + "_spread"] = _summary(values)
        worst = [max(a, b) for a, b in zip(samples[f"takeover_first_record_s_{keys}_release"],
                                           samples[f"takeover_first_record_s_{keys}_kill"], strict=True)]
        out[f"takeover_first_record_s_{keys}"], out[f"takeover_first_record_s_{keys}_spread"] = _summary(worst)
        out[f"takeover_loaded_s_{keys}"] = out[f"takeover_first_record_s_{keys}"]  # (a replica is fully loaded)
    return out
