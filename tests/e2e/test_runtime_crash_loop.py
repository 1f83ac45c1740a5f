"""Crash loop: at least 20 random SIGKILLs of worker processes while a job with windows and
a two-input join runs in aligned (and in unaligned) exactly-once mode, with the materializer
in the background.

Afterwards:

* the committed output equals the golden output exactly once (tests/support/jobs.py);
* checkpoints spread over the run, restored at parallelism 1, hold exactly the state their
  source positions imply: every window holds the count of its clicks before the positions
  (and its timer) unless its result was committed with a checkpoint up to this one; the
  join holds the unmatched orders and payments before the positions.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

import statelog
from materializer.background import start_background
from runtime import FixedDelay, read_committed
from runtime.api.windows import WINDOW_STATE
from statelog import PICKLE, AggregatingStateDescriptor
from tests.support import batch_jobs, jobs
from tests.support.chaos import damage_copies, kill_workers
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec

# the suite's loops are short; STATELOG_LONG_LOOPS=1 runs the longer ones (20 kills)
KILLS = 20 if os.environ.get("STATELOG_LONG_LOOPS") == "1" else 8
CHECKED = 8


def committed_windows(out: Path) -> dict[tuple[str, int], list[int]]:
    """For every window result committed, the checkpoints of the files that hold it."""
    found: dict[tuple[str, int], list[int]] = {}
    for p in sorted(out.glob("part-*.jsonl")):
        cid = int(p.name.split("-")[1])
        for line in p.read_text().splitlines():
            user, start, _count = json.loads(line)
            found.setdefault((user, start), []).append(cid)
    return found


def check_checkpoints(root: RootSpec, out: Path) -> int:
    committed = committed_windows(out)
    with statelog.open(root.url) as job:
        ids = job.catalog.checkpoint_ids()
        step = max(1, len(ids) // CHECKED)
        picked = ids[::step][:CHECKED] + [ids[-1]]
        for cid in picked:
            meta = job.load_checkpoint(cid)
            b = job.backend("window-count", restore=cid)
            b.get_state(AggregatingStateDescriptor(WINDOW_STATE, PICKLE, aggregate=jobs.CountClicks()))
            state = {(k, ns[0]): v for k, ns, v in b.entries(WINDOW_STATE)}
            timers = {(t.key, t.namespace[0]) for t in b.timers.timers("event")}
            b.close()
            errors = jobs.window_checkpoint_errors(meta, state, timers, committed)
            assert not errors, "\n".join(errors[:10])
            j = job.backend("join", restore=cid)
            j.get_state(jobs.ORDER)
            j.get_state(jobs.PAID)
            orders = {k: v for k, _ns, v in j.entries("order")}
            paid = {k for k, _ns, v in j.entries("paid") if v}
            j.close()
            assert (orders, paid) == jobs.expected_join_state(meta.sources), f"join state of checkpoint {cid}"
    return len(picked)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize(("on_demand", "store"), [(False, "memory"), (True, "memory"), (False, "disk")],
                         ids=["eager", "on-demand", "disk"])  # fmt: skip
def test_random_worker_kills_in_aligned_mode(
    file_root: RootSpec, tmp_path: Path, on_demand: bool, store: str
) -> None:
    """``disk``: the disk-backed working set, its cache (1 MiB) smaller than the join state."""
    env = make_env(file_root, restart_strategy=FixedDelay(attempts=4 * KILLS, delay_s=0.0), retain_checkpoints=1000,
                   on_demand_restore=on_demand, state_store=store, state_memory="1MB",
                   state_dir=str(tmp_path / "working-state"))  # fmt: skip
    # paced input (16 s per source subtask, more than the kills consume) that cannot end before
    # the gate opens; once the kills landed the rest is read at full speed
    gate = tmp_path / "gate"
    jobs.build_clicks(env, tmp_path / "windows", 16_000, rate=2000, gate=gate)
    jobs.build_join(env, tmp_path / "join", 8000, order_rate=1000, payment_rate=1000, gate=gate)
    t0 = time.monotonic()
    client = env.execute_async("crash-loop")
    assert client.wait_running(1, timeout=60)
    # the materializer keeps restores short: backends adopt its materializations
    with start_background(file_root.url, interval_s=1.0, run_gc=False):
        kills = kill_workers(client, KILLS, random.Random(20), 0.1, 0.7)
        jobs.open_gate(gate)
        result = client.wait(300)
    print(
        f"{kills.count} kills ({kills.after_checkpoint} after a checkpoint) at {kills.at}; "
        f"{result.attempts} attempts, {len(result.completed_checkpoints)} checkpoints, "
        f"{time.monotonic() - t0:.1f}s"
    )
    assert kills.count >= KILLS, f"the job ended before all kills landed: {kills}"
    # the kills that land before the job's first checkpoint restart it from nothing; how many do
    # depends on the machine's load at the start (3 of 12 seen on a busy CI machine), not on KILLS
    assert kills.after_checkpoint >= KILLS // 2, kills
    assert result.attempts >= KILLS + 1
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(16_000)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(8000)
    checked = check_checkpoints(file_root, tmp_path / "windows")
    print(f"{checked} checkpoints restored and checked against their source positions")
    # restarted attempts report when their workers processed a first record and loaded all;
    # the kills land 0.1-0.7 s after an attempt runs and a restore takes 0.1-0.8 s on a busy
    # machine, so many attempts are killed before they report (8 of 20 seen with the other
    # crash loops running beside this test, 13-17 alone)
    restored = {a: s for a, s in result.restore_stats.items() if a > 1}
    assert len(restored) >= KILLS // 4, result.restore_stats
    for stats in restored.values():
        assert stats["on_demand"] is on_demand and stats["workers"] >= 1
        assert stats["first_record_s"] > 0 and stats["fully_loaded_s"] > 0
    print("restore stats per attempt:", {a: (s["first_record_s"], s["fully_loaded_s"]) for a, s in restored.items()})
    # local copies are on by default: the restarted workers read what their predecessors wrote
    # on this host from the copies
    assert any(s.get("objects_local", 0) > 0 for s in restored.values()), restored
    if store == "disk":  # every killed worker's directory was deleted by its successor, the rest at close
        assert not list((tmp_path / "working-state").iterdir())


DAMAGED_KILLS = 6


@pytest.mark.slow
@pytest.mark.fault
def test_worker_kills_with_every_local_copy_damaged_before_the_restores(file_root: RootSpec, tmp_path: Path) -> None:
    """Before each kill every local copy is flipped or truncated: the restarted workers drop
    them, read the objects from the store and the output and checkpoints stay exact."""
    copies = tmp_path / "copies"
    env = make_env(file_root, restart_strategy=FixedDelay(attempts=4 * DAMAGED_KILLS, delay_s=0.0),
                   retain_checkpoints=1000, on_demand_restore=False,
                   local_copies={"directory": str(copies), "budget_bytes": 1 << 28})  # fmt: skip
    gate = tmp_path / "gate"
    jobs.build_clicks(env, tmp_path / "windows", 6000, rate=2000, gate=gate)
    jobs.build_join(env, tmp_path / "join", 3000, order_rate=1000, payment_rate=1000, gate=gate)
    client = env.execute_async("crash-loop-damaged-copies")
    assert client.wait_running(1, timeout=60)
    rng, attempt, kills, damaged = random.Random(23), 0, 0, 0
    with start_background(file_root.url, interval_s=1.0, run_gc=False):
        while kills < DAMAGED_KILLS and client.wait_running(attempt + 1, timeout=60):
            time.sleep(rng.uniform(0.3, 0.9))
            attempt, pids = client.running_attempt, client.worker_pids()
            if client.done or not pids:
                break
            damaged += damage_copies(copies, rng)
            try:
                os.kill(rng.choice(pids), signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills += 1
        jobs.open_gate(gate)
        result = client.wait(300)
    assert kills == DAMAGED_KILLS and damaged > 0
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(6000)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(3000)
    check_checkpoints(file_root, tmp_path / "windows")
    restored = {a: s for a, s in result.restore_stats.items() if a > 1}
    assert sum(s.get("copies_dropped", 0) for s in restored.values()) > 0, restored
    print("damaged copies:", damaged, "restore stats:", restored)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("on_demand", [False, True], ids=["eager", "on-demand"])
def test_random_worker_kills_in_unaligned_mode(file_root: RootSpec, tmp_path: Path, on_demand: bool) -> None:
    """The same crash loop in unaligned mode: every restore replays the in-flight records of
    its checkpoint. Checked: the output is golden; the join state of checkpoints spread over
    the run, plus their in-flight records, is what their source positions imply; the
    in-flight objects of checkpoints no longer retained are deleted. (This loop found that a
    restored task handled a waiting barrier before its replay; test_debloat pins the order.)"""
    env = make_env(
        file_root,
        mode="exactly_once_unaligned",
        checkpoint_interval_s=0.1,
        restart_strategy=FixedDelay(attempts=4 * KILLS, delay_s=0.0),
        retain_checkpoints=1000,
        on_demand_restore=on_demand,
    )
    gate = tmp_path / "gate"
    jobs.build_clicks(env, tmp_path / "windows", 16_000, rate=2000, gate=gate)
    jobs.build_join(env, tmp_path / "join", 8000, order_rate=1000, payment_rate=1000, gate=gate)
    t0 = time.monotonic()
    client = env.execute_async("crash-loop-unaligned")
    assert client.wait_running(1, timeout=60)
    with start_background(file_root.url, interval_s=1.0, run_gc=False):
        kills = kill_workers(client, KILLS, random.Random(21), 0.1, 0.7)
        jobs.open_gate(gate)
        result = client.wait(300)
    took = time.monotonic() - t0
    with_inflight = sum(1 for s in result.checkpoint_stats.values() if s.get("inflight_bytes", 0) > 0)
    print(
        f"unaligned: {kills.count} kills ({kills.after_checkpoint} after a checkpoint); "
        f"{result.attempts} attempts, {len(result.completed_checkpoints)} checkpoints "
        f"({with_inflight} with in-flight data), {took:.1f}s"
    )
    assert kills.count >= KILLS, f"the job ended before all kills landed: {kills}"
    assert kills.after_checkpoint >= KILLS // 2, kills
    assert result.attempts >= KILLS + 1
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(16_000)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(8000)
    assert with_inflight > 0
    assert all(st["on_demand"] is on_demand for a, st in result.restore_stats.items() if a > 1)
    with statelog.open(file_root.url) as job:
        ids = job.catalog.checkpoint_ids()
        step = max(1, len(ids) // CHECKED)
        for cid in ids[::step][:CHECKED] + [ids[-1]]:
            meta = job.load_checkpoint(cid)
            j = job.backend("join", restore=cid)
            j.get_state(jobs.ORDER)
            j.get_state(jobs.PAID)
            state = ({k: v for k, _ns, v in j.entries("order")}, {k for k, _ns, v in j.entries("paid") if v})
            j.close()
            orders, paid, _n = jobs.apply_inflight(file_root, meta, state)
            assert (orders, paid) == jobs.expected_join_state(meta.sources), f"join state of checkpoint {cid}"
    # generous: the run takes 20-40 s (loaded machine: 60); a restore stuck behind its replay
    # would wait for checkpoint timeouts (30 s each) and exceed it
    assert took < 180, f"the unaligned crash loop took {took:.0f}s"


BATCH_KILLS = 4
BATCH_PER_SPLIT = 6000


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("mode", ["exactly_once_aligned", "exactly_once_unaligned"], ids=["aligned", "unaligned"])
def test_random_worker_kills_in_a_job_of_record_batches(file_root: RootSpec, tmp_path: Path, mode: str) -> None:
    """The batch job of tests/support/batch_jobs.py (batches from the source, split by key
    group, process_batches and aggregate on the batch state calls): after the kills its
    output holds every event exactly once and its final state is the input's; in aligned mode
    checkpoints spread over the run, restored at parallelism 1, hold the state of the events
    before their source positions."""
    env = make_env(file_root, mode=mode, restart_strategy=FixedDelay(attempts=4 * BATCH_KILLS, delay_s=0.0),
                   retain_checkpoints=1000)  # fmt: skip
    gate = tmp_path / "gate"
    source = jobs.GatedGeneratorSource(batch_jobs.make_event, BATCH_PER_SPLIT, batch_jobs.SPLITS, rate=2000,
                                       gate=gate, parallelism=2)  # fmt: skip
    batch_jobs.build_batch(env, source, tmp_path / "out", batch_rows=200)
    client = env.execute_async("crash-loop-batches")
    assert client.wait_running(1, timeout=60)
    kills = kill_workers(client, BATCH_KILLS, random.Random(39), 0.2, 0.8)
    jobs.open_gate(gate)
    result = client.wait(300)
    print(f"batches, {mode}: {kills.count} kills at {kills.at}; {result.attempts} attempts, "
          f"{len(result.completed_checkpoints)} checkpoints")
    assert kills.count >= BATCH_KILLS, f"the job ended before all kills landed: {kills}"
    assert result.attempts >= BATCH_KILLS + 1
    rows = batch_jobs.events(BATCH_PER_SPLIT)
    assert batch_jobs.as_counter(read_committed(tmp_path / "out")) == batch_jobs.as_counter(rows)
    assert batch_jobs.final_state(file_root.url, result.final_checkpoint, 2) == batch_jobs.expected_state(rows)
    if mode == "exactly_once_unaligned":
        return  # (its checkpoints' state is completed by their in-flight batches)
    with statelog.open(file_root.url) as job:
        ids = job.catalog.checkpoint_ids()
        picked = ids[:: max(1, len(ids) // CHECKED)][:CHECKED]
        sources = {cid: job.load_checkpoint(cid).sources for cid in picked}
    for cid, src in sources.items():
        expected = batch_jobs.expected_state(batch_jobs.rows_before(src))
        assert batch_jobs.final_state(file_root.url, cid, 1) == expected, f"checkpoint {cid}"
