"""Back-pressure benchmark: checkpoints of a job whose last operator is slow, with buffer
debloating on and off, aligned and unaligned, side by side in one run.

* **Job** (parallelism 2, ``file://`` root in a temporary directory, a checkpoint every
  second): ``GeneratorSource`` (2 splits of ``(key, i)``, ``key = i % 1000``) ->
  ``key_by`` -> ``pass-1`` -> ``key_by`` -> ``pass-2`` -> ``key_by`` -> ``slow``: three
  exchanges (hash edges; with parallelism 2 each has in-process and TCP channels). The pass
  operators forward every record; ``slow`` counts per key (``ValueState``) and is paced to
  ``RATE`` records per second per subtask (it sleeps on the task thread when ahead), so the
  channels fill up and back-pressure reaches the sources. The input is ``RATE x 2 x
  DURATION_S`` records, so a run lasts about ``DURATION_S`` (60 s; ``--quick``: 10 s).
* **Variants**: debloating off (``buffer_debloat_target=None``: channels hold
  ``channel_capacity`` frames plus the sender queue and the TCP buffers) and on
  (``TARGET_S`` = 200 ms), each in ``exactly_once_aligned`` and ``exactly_once_unaligned``
  mode; the four run interleaved, ``ROUNDS`` times.
* **Figures** per variant (over all checkpoints of all its rounds, nearest rank): checkpoint
  duration p50/p99 (trigger to completion, ``duration_ms``), alignment p99 (first to last
  barrier at the slowest task, ``alignment_ms``), in-flight bytes per checkpoint (median and
  max of ``inflight_bytes``: what unaligned checkpoints persisted), checkpoints completed,
  throughput (input records ÷ the job's wall time; median over rounds, with min and max).
* **Ratios**: off ÷ on for the aligned checkpoint p99 and the unaligned in-flight bytes
  (median), on ÷ off for the throughput; ``aligned_p99_bound_ms`` = 3 x exchanges x target.
* **Check**: every run's final checkpoint is restored and the counts of ``slow`` must add up
  to the input; a mismatch aborts the benchmark.
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
from bench.runtime import percentile
from runtime import CollectSink, GeneratorSource, KeyedProcessFunction, StreamExecutionEnvironment
from statelog import ValueStateDescriptor

RATE = 2000  # records per second per subtask of the slow operator
DURATION_S = 60
QUICK_DURATION_S = 10
TARGET_S = 0.2
EXCHANGES = 3
ROUNDS = 2
KEYS = 1000
PARALLELISM = 2
UID = "slow"
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
VARIANTS = (
    ("aligned_off", "exactly_once_aligned", None),
    ("aligned_on", "exactly_once_aligned", TARGET_S),
    ("unaligned_off", "exactly_once_unaligned", None),
    ("unaligned_on", "exactly_once_unaligned", TARGET_S),
)


def make_record(split: int, i: int) -> tuple[int, int]:
    return (i % KEYS, i)


def key_of(e: tuple[int, int]) -> int:
    return e[0]


def key_shifted(e: tuple[int, int]) -> int:
    return (e[0] * 7919) % KEYS


class Pass(KeyedProcessFunction):
    def process_element(self, e: Any, ctx: Any) -> Any:
        return (e,)


class Slow(KeyedProcessFunction):
    """Counts per key at ``rate`` records per second at most (sleeps when ahead)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)
        self.t0: float | None = None
        self.n = 0

    def process_element(self, e: Any, ctx: Any) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.n += 1
        ahead = self.n / self.rate - (now - self.t0)
        if ahead > 0.002:
            time.sleep(ahead)
        self.count.update(self.count.value() + 1)


def run_job(root: str, mode: str, target: float | None, records: int) -> Any:
    env = StreamExecutionEnvironment(
        parallelism=PARALLELISM,
        checkpoint_interval_s=1.0,
        checkpoint_timeout_s=300.0,
        mode=mode,
        state_root=root,
        buffer_debloat_target=target,
    )
    per_split = records // PARALLELISM
    events = env.from_source(GeneratorSource(make_record, per_split, splits=PARALLELISM), uid="events")
    (events.key_by(key_of).process(Pass(), uid="pass-1")
     .key_by(key_shifted).process(Pass(), uid="pass-2")
     .key_by(key_of).process(Slow(RATE), uid=UID)
     .sink_to(CollectSink(), uid="out"))  # fmt: skip
    return env.execute(f"bench-backpressure-{mode}-{target}")


def total_count(root: str, checkpoint_id: int) -> int:
    with statelog.open(root, create=False) as job:
        total = 0
        for i in range(PARALLELISM):
            b = job.backend(UID, subtask=i, parallelism=PARALLELISM, restore=checkpoint_id, changelog=False)
            b.get_state(COUNT)
            total += sum(v for _, _, v in b.entries("count"))
            b.close()
        return total


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    if root is not None:
        raise SystemExit("bench backpressure uses fresh temporary roots (file://); --root is not supported")
    duration = QUICK_DURATION_S if quick else DURATION_S
    rounds = 1 if quick else ROUNDS
    records = RATE * PARALLELISM * duration
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-backpressure-"))
    stats: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in VARIANTS}
    rates: dict[str, list[float]] = {name: [] for name, _, _ in VARIANTS}
    n = 0
    try:
        # warm-up, not counted: the first job of a process also starts the forkserver
        run_job((work / "root-warm-up").as_uri(), "exactly_once_aligned", TARGET_S, RATE * PARALLELISM)
        for r in range(rounds):
            for name, mode, target in VARIANTS:
                n += 1
                root_dir = work / f"root-{n}"
                try:
                    res = run_job(root_dir.as_uri(), mode, target, records)
                    got = total_count(root_dir.as_uri(), res.final_checkpoint)
                    if got != records:
                        raise RuntimeError(f"{name}: the final checkpoint counts {got} records, not {records}")
                finally:
                    shutil.rmtree(root_dir, ignore_errors=True)
                # the final checkpoint (end of input, nothing buffered) is no back-pressure case
                sts = [s for cid, s in sorted(res.checkpoint_stats.items()) if cid != res.final_checkpoint]
                stats[name].extend(sts)
                rates[name].append(records / res.duration_s)
                durs = [s["duration_ms"] for s in sts] or [0.0]
                _log(progress, f"round {r + 1} {name}: {rates[name][-1]:,.0f} records/s ({res.duration_s:.1f}s), "
                     f"{len(sts)} checkpoints, p50 {percentile(durs, 0.5):.0f} ms, "
                     f"p99 {percentile(durs, 0.99):.0f} ms, in-flight max "
                     f"{max((s.get('inflight_bytes', 0) for s in sts), default=0):,} B")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    out: dict[str, Any] = {
        "records": records, "rate_per_subtask": RATE, "duration_s": duration, "rounds": rounds,
        "exchanges": EXCHANGES, "target_ms": TARGET_S * 1000,
        "aligned_p99_bound_ms": 3 * EXCHANGES * TARGET_S * 1000,
    }  # fmt: skip
    for name, _, _ in VARIANTS:
        sts = stats[name]
        durs = [s["duration_ms"] for s in sts] or [float("nan")]
        align = [s.get("alignment_ms", 0.0) for s in sts] or [float("nan")]
        inflight = [s.get("inflight_bytes", 0) for s in sts] or [0]
        out[f"{name}_checkpoints"] = len(sts)
        out[f"{name}_checkpoint_p50_ms"] = round(percentile(durs, 0.5), 1)
        out[f"{name}_checkpoint_p99_ms"] = round(percentile(durs, 0.99), 1)
        out[f"{name}_alignment_p99_ms"] = round(percentile(align, 0.99), 1)
        out[f"{name}_inflight_bytes_median"] = int(statistics.median(inflight))
        out[f"{name}_inflight_bytes_max"] = max(inflight)
        out[f"{name}_records_per_s"] = round(statistics.median(rates[name]))
        out[f"{name}_records_per_s_spread"] = [round(min(rates[name])), round(max(rates[name]))]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    out["aligned_p99_off_over_on"] = ratio(out["aligned_off_checkpoint_p99_ms"], out["aligned_on_checkpoint_p99_ms"])
    out["unaligned_p99_off_over_on"] = ratio(out["unaligned_off_checkpoint_p99_ms"],
                                             out["unaligned_on_checkpoint_p99_ms"])  # fmt: skip
    out["unaligned_inflight_off_over_on"] = ratio(out["unaligned_off_inflight_bytes_median"],
                                                  out["unaligned_on_inflight_bytes_median"])  # fmt: skip
    out["aligned_throughput_on_over_off"] = ratio(out["aligned_on_records_per_s"], out["aligned_off_records_per_s"])
    out["unaligned_throughput_on_over_off"] = ratio(out["unaligned_on_records_per_s"],
                                                    out["unaligned_off_records_per_s"])  # fmt: skip
    return out
