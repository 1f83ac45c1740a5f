"""Followers: how far a follower is behind a writer, at consistency "checkpoint" and "flushed".

``python -m bench follow [--json] [--quick] [--keys N,N] [--takeover-only] [--persist-delay S]``

A writer process updates a ``ValueState<int64>`` of ``KEYS`` int keys (first written once
and checkpointed) at ``RATE`` updates/s, paced, with a checkpoint every second, for
``SECONDS`` s. Two followers (``statelog.follow``), one per consistency level, each in a
process of its own (no GIL shared with the writer or each other), poll every ``POLL_S`` s in
their background threads; every ``SAMPLE_S`` s after the first ``WARMUP_S`` s of updates
each reads its position: the lag at "checkpoint" is ``lag_s`` (now minus the timestamp of
the checkpoint the state is at), at "flushed" ``data_lag_s`` (now minus the time of the
newest change applied). Per round the p50 and p99 of the samples
(``lag_p99_s_checkpoint``, ``lag_p99_s_flushed``), the CPU of each follower's polling thread
per change it applied (``follower_cpu_us_per_change_<level>``, from /proc) and the
writer process's CPU per update, its checkpoints and uploads included
(``writer_cpu_us_per_update``); over the rounds the median with its spread
(``(max - min) / median``), and the writer's achieved rate and the followers' restores (1
each: they kept up without restoring again). ``lookup_p99_us_polling``: the p99 of
``follower.get`` of random keys at "checkpoint", in the follower's process after the writer
stopped, its thread still polling every ``POLL_S`` s. Then the lookup figures of
:mod:`bench.follow_lookups` (``lookup_p99_us`` in a follower polling at the default rate,
``http_p99_ms``, ``flight_batch_1000_ms``, ``sql_count_s_first``, ...), same sizes.

Takeover (:mod:`bench.follow_takeover`): ``takeover_first_record_s_<keys>``, seconds from the
writer lease freeing (clean close or SIGKILL) to the first record a hot standby processes,
against a cold on-demand restore and an eager restore of the same root, for each key count
of ``--keys`` (default 10^6 and 10^7; ``--quick``: 20,000), over ``TAKEOVER_ROUNDS`` rounds.
``--takeover-only`` skips the freshness figures. ``--persist-delay S``: the writer's
``persist_delay`` (default the option's, 0.25 s; ``writer_persist_delay_s`` in the JSON): a
change reaches a "flushed" follower at the earliest when its segment is uploaded, so this
bounds the lag at "flushed" from below. ``load_average_1m`` (before and after) says how busy
the machine was.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import statelog
from bench import follow_lookups, follow_takeover
from bench.follow_seed import UID, seed

KEYS, RATE, SECONDS, ROUNDS = 1_000_000, 50_000, 20.0, 3
QUICK = {"KEYS": 20_000, "RATE": 20_000, "SECONDS": 4.0, "ROUNDS": 1}
POLL_S, SAMPLE_S, WARMUP_S = 0.02, 0.05, 2.0
TAKEOVER_KEYS, TAKEOVER_ROUNDS = [1_000_000, 10_000_000], 3


def _writer(root: str, keys: int, rate: int, seconds: float, ready: Any, go: Any, done: Any,
            persist_delay: float | None = None) -> None:  # fmt: skip
    job = statelog.open(root, writer_options=None if persist_delay is None else {"persist_delay": persist_delay})
    b, st = seed(job, keys)
    ready.set()
    go.wait(600)  # the followers restored
    rng = random.Random(1)
    n, t0, cpu0 = 0, time.monotonic(), time.process_time()
    next_cp = t0 + 1.0
    while (now := time.monotonic()) < t0 + seconds:
        for k in rng.choices(range(keys), k=1000):
            b.set_current_key(k)
            st.update(n)
        n += 1000
        if now >= next_cp:
            job.checkpoint()
            next_cp += 1.0
        ahead = n / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    # the whole process (its uploading threads too), checkpoints included
    done.put({"rate": n / (time.monotonic() - t0), "cpu_us_per_update": (time.process_time() - cpu0) / n * 1e6})
    job.close()


def _thread_cpu_s(native_id: int) -> float:
    """CPU seconds (user + system) of thread ``native_id`` of this process (Linux /proc)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _follower(root: str, consistency: str, keys: int, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """One follower in its own process (no GIL shared with the writer or the other follower):
    its lag every ``SAMPLE_S`` s after ``WARMUP_S`` s, the CPU of its polling thread per change
    applied, and (consistency "checkpoint") lookups after the writer stopped."""
    f = statelog.follow(root, consistency=consistency, poll_s=POLL_S, on_demand=False)
    ready.set()
    assert f._thread is not None and f._thread.native_id is not None
    tid = f._thread.native_id
    go.wait(600)  # (before: the writer waits for both followers to restore; its first checkpoint ages)
    cpu0, applied0 = _thread_cpu_s(tid), f.changes_applied
    warm = time.monotonic() + WARMUP_S
    lags: list[float] = []
    while not stop.is_set():
        if time.monotonic() >= warm:
            pos = f.position
            lags.append(pos.lag_s if consistency == "checkpoint" else pos.data_lag_s)
        time.sleep(SAMPLE_S)
    cpu, applied = _thread_cpu_s(tid) - cpu0, f.changes_applied - applied0
    lookups = []
    if consistency == "checkpoint":
        rng = random.Random(2)
        for k in rng.choices(range(keys), k=20_000):
            t = time.perf_counter()
            f.get(UID, "v", k)
            lookups.append((time.perf_counter() - t) * 1e6)
    out.put({"lags": lags, "cpu_us_per_change": cpu / applied * 1e6 if applied else float("nan"),
             "applied": applied, "restores": f.position.restores, "lookups": lookups})  # fmt: skip
    f.close()


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _freshness(root: str, keys: int, rate: int, seconds: float, persist_delay: float | None = None) -> dict[str, float]:
    """One round of the freshness figures: the writer and each follower in a process of its own."""
    ctx = mp.get_context("spawn")
    ready, go, stop, done = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=_writer, args=(root, keys, rate, seconds, ready, go, done, persist_delay))
    procs = [writer]
    writer.start()
    try:
        if not ready.wait(600):
            raise RuntimeError("the writer did not write its first checkpoint in 600 s")
        outs: dict[str, Any] = {}
        for c in ("checkpoint", "flushed"):
            up, outs[c] = ctx.Event(), ctx.Queue()
            procs.append(ctx.Process(target=_follower, args=(root, c, keys, up, go, stop, outs[c])))
            procs[-1].start()
            if not up.wait(600):
                raise RuntimeError(f"the {c} follower did not restore in 600 s")
        go.set()
        w = done.get(timeout=seconds + 600)
        stop.set()
        got = {c: q.get(timeout=600) for c, q in outs.items()}
    finally:
        stop.set()
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
    return {
        "lag_p50_s_checkpoint": _p(got["checkpoint"]["lags"], 0.5), "lag_p99_s_checkpoint": _p(got["checkpoint"]["lags"], 0.99),
        "lag_p50_s_flushed": _p(got["flushed"]["lags"], 0.5), "lag_p99_s_flushed": _p(got["flushed"]["lags"], 0.99),
        "follower_cpu_us_per_change_checkpoint": got["checkpoint"]["cpu_us_per_change"],
        "follower_cpu_us_per_change_flushed": got["flushed"]["cpu_us_per_change"],
        "writer_cpu_us_per_update": w["cpu_us_per_update"], "writer_updates_per_s": w["rate"],
        "lookup_p99_us_polling": _p(got["checkpoint"]["lookups"], 0.99),
        "restores_checkpoint": got["checkpoint"]["restores"], "restores_flushed": got["flushed"]["restores"],
        "samples": len(got["checkpoint"]["lags"]),
    }  # fmt: skip


def run(quick: bool = False, root: str | None = None, progress: bool = True, keys: list[int] | None = None,
        takeover_only: bool = False, persist_delay: float | None = None) -> dict[str, Any]:
    """The freshness figures (unless ``takeover_only``; the writer with ``persist_delay`` if
    given, else the option's default) and the takeover figures; ``load_average_1m`` before
    and after says how busy the machine was."""
    load_before = os.getloadavg()[0]
    out: dict[str, Any] = {} if takeover_only else _freshness_rounds(quick, root, progress, persist_delay)
    if not takeover_only:  # the lookup figures of the same run (bench.follow_lookups)
        out.update(follow_lookups.measure_lookups(root, **(follow_lookups.QUICK if quick else {}), progress=progress))
    takeover_keys = keys or ([QUICK["KEYS"]] if quick else TAKEOVER_KEYS)
    out.update(follow_takeover.run(takeover_keys, 1 if quick else TAKEOVER_ROUNDS, root, progress))
    out["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    out["cpus"] = os.cpu_count()
    return out


def _freshness_rounds(quick: bool, root: str | None, progress: bool, persist_delay: float | None = None) -> dict[str, Any]:
    keys, rate, seconds, rounds = (
        (QUICK["KEYS"], QUICK["RATE"], QUICK["SECONDS"], QUICK["ROUNDS"]) if quick else (KEYS, RATE, SECONDS, ROUNDS)
    )
    per_round = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
            r = root.rstrip("/") + f"/round-{i}-{time.time_ns()}" if root else (Path(tmp) / "root").as_uri()
            per_round.append(_freshness(r, keys, rate, seconds, persist_delay))
        if progress:
            print(f"round {i + 1}/{rounds}: {per_round[-1]}", flush=True)
    from statelog.options.engine import WriterOptions

    out: dict[str, Any] = {"keys": keys, "target_updates_per_s": rate, "seconds": seconds, "rounds": rounds,
                           "writer_persist_delay_s": WriterOptions().persist_delay if persist_delay is None
                           else persist_delay}  # fmt: skip
    for name in per_round[0]:
        values = [r[name] for r in per_round]
        med = statistics.median(values)
        out[name] = round(med, 4)
        out[name + "_spread"] = round((max(values) - min(values)) / med, 3) if med else 0.0
    return out


if __name__ == "__main__":
    import sys

    from bench.__main__ import main

    sys.exit(main(["follow", *sys.argv[1:]]))
