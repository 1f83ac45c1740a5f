"""Exactly-once output through the file sink: windows and a two-input join, with and
without worker SIGKILLs, against plain-Python golden outputs (``tests/support/jobs.py``)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import statelog
from runtime import (
    CollectSink,
    FileSink,
    FileSource,
    GeneratorSource,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    read_committed,
)
from runtime.network import inflight
from statelog import layout
from statelog.layout import parse_manifest_key
from tests.support import jobs
from tests.support.chaos import kill_workers
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec


def test_windows_and_join_produce_the_golden_output(file_root: RootSpec, tmp_path: Path) -> None:
    env = make_env(file_root)
    jobs.build_clicks(env, tmp_path / "windows", 1200)
    jobs.build_join(env, tmp_path / "join", 800)
    result = env.execute("golden", timeout_s=120)
    assert result.attempts == 1 and result.final_checkpoint is not None
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(1200)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(800)
    assert not list((tmp_path / "windows" / ".pending").iterdir())
    with statelog.open(file_root.url) as job:
        final = job.load_checkpoint(result.final_checkpoint)
    # the final checkpoint: every split at its end, every stateful operator, statistics
    assert final.sources["clicks"] == {f"{k:04d}": {"next": 1200, "max_ts": max(
        jobs.make_click(k, i)[1] for i in range(1200))} for k in range(jobs.CLICK_SPLITS)}
    assert set(final.operators) == {"window-count", "join"}
    assert {"duration_ms", "sync_ms", "async_ms", "alignment_ms", "incremental_bytes", "records_per_s"} <= set(final.stats)
    assert final.stats["source_records"] == 1200 * jobs.CLICK_SPLITS + 2 * 800 * jobs.ORDER_SPLITS


def test_worker_kills_recover_to_identical_output(file_root: RootSpec, tmp_path: Path) -> None:
    env = make_env(file_root)
    jobs.build_clicks(env, tmp_path / "windows", 5000, rate=2500)
    jobs.build_join(env, tmp_path / "join", 2400, order_rate=1200, payment_rate=1200)
    client = env.execute_async("kills")
    kills = kill_workers(client, 3, random.Random(5))
    result = client.wait(180)
    assert kills.count == 3, kills
    assert result.attempts == 4, result.failures
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(5000)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(2400)


def test_unaligned_worker_kills_recover_to_identical_output(file_root: RootSpec, tmp_path: Path) -> None:
    """The golden windows and join job in unaligned mode, with SIGKILLs: restores replay the
    in-flight records of their checkpoint before new input, and the output is identical."""
    env = make_env(file_root, mode="exactly_once_unaligned", checkpoint_interval_s=0.1)
    jobs.build_clicks(env, tmp_path / "windows", 5000, rate=2500)
    jobs.build_join(env, tmp_path / "join", 2400, order_rate=1200, payment_rate=1200)
    client = env.execute_async("unaligned-kills")
    kills = kill_workers(client, 3, random.Random(7))
    result = client.wait(180)
    assert kills.count == 3, kills
    assert result.attempts == 4, result.failures
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(5000)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(2400)
    assert all(s["mode"] == "exactly_once_unaligned" for s in result.checkpoint_stats.values())
    # in-flight objects are kept for the retained checkpoints only (retain_checkpoints=5)
    with statelog.open(file_root.url) as job:
        retained = set(job.catalog.checkpoint_ids())
        left = {int(i.key.split("/")[2][4:]) for i in job.store.list(layout.INFLIGHT_PREFIX)}
        for cid in retained:  # and they verify
            inflight.read_all(job.store, job.load_checkpoint(cid).sources)
    assert left <= retained, (left, retained)


def _click_json(line: bytes) -> Any:
    return tuple(json.loads(line))


def test_file_source_sliding_windows_and_collect_sink_with_a_kill(file_root: RootSpec, tmp_path: Path) -> None:
    src = tmp_path / "input"
    src.mkdir()
    per_split = 2000
    for k in range(jobs.CLICK_SPLITS):
        with open(src / f"clicks-{k}.jsonl", "w") as f:
            for i in range(per_split):
                f.write(json.dumps(list(jobs.make_click(k, i))) + "\n")
    env = make_env(file_root, parallelism=3)
    clicks = env.from_source(
        FileSource(src, parse=_click_json, records_per_s=2500),
        uid="files",
        watermarks=WatermarkStrategy(jobs.click_ts, jobs.OOO_MS),
    )
    counts = (
        clicks.filter(jobs.click_user)  # every user is a non-empty string
        .key_by(jobs.click_user)
        .window(SlidingEventTimeWindows(jobs.WINDOW_MS, jobs.WINDOW_MS // 2))
        .aggregate(jobs.CountClicks(), uid="sliding", window_function=jobs.window_row)
    )
    counts.sink_to(CollectSink(), uid="collected")
    counts.map(tuple).sink_to(CollectSink(), uid="collected-tuples")
    client = env.execute_async("files")
    kills = kill_workers(client, 1, random.Random(11), 0.5, 1.0)
    result = client.wait(180)
    assert kills.count == 1
    golden = jobs.golden_windows(per_split, slide=jobs.WINDOW_MS // 2)
    assert sorted(result.collected["collected"]) == golden
    assert sorted(list(t) for t in result.collected["collected-tuples"]) == golden


def test_union_and_chained_stateless_operators(file_root: RootSpec, tmp_path: Path) -> None:
    env = make_env(file_root, parallelism=2)
    a = env.from_source(GeneratorSource(jobs.make_click, 500, splits=2), uid="a",
                        watermarks=WatermarkStrategy(jobs.click_ts, jobs.OOO_MS))
    b = env.from_source(GeneratorSource(jobs.make_click, 300, splits=3), uid="b",
                        watermarks=WatermarkStrategy(jobs.click_ts, jobs.OOO_MS))
    (
        a.union(b)
        .flat_map(jobs.twice)
        .key_by(jobs.click_user)
        .window(TumblingEventTimeWindows(jobs.WINDOW_MS))
        .aggregate(jobs.CountClicks(), uid="union-count", window_function=jobs.window_row)
        .sink_to(FileSink(tmp_path / "out"), uid="out")
    )
    env.execute("union", timeout_s=120)
    c: Counter[tuple[str, int]] = Counter()
    for splits, n in ((2, 500), (3, 300)):
        for u, s, cnt in jobs.golden_windows(n, splits=splits):
            c[(u, s)] += 2 * cnt
    assert sorted(read_committed(tmp_path / "out")) == sorted([u, s, n] for (u, s), n in c.items())


@pytest.mark.parametrize("before_final", [True, False], ids=["before-final", "off"])
def test_a_finished_job_ends_on_a_materialization_of_all_its_input(
    file_root: RootSpec, tmp_path: Path, before_final: bool
) -> None:
    """The master's materializer (which would not run again for an hour on its own) materializes
    a checkpoint that covers all input before the final checkpoint, which builds on it."""
    env = make_env(file_root, materializer={"interval_s": 3600.0}, materialize_before_final=before_final,
                   retain_checkpoints=1000)
    jobs.build_clicks(env, tmp_path / "windows", 2000)
    result = env.execute("final-materialization", timeout_s=120)
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(2000)
    with statelog.open(file_root.url, create=False) as job:
        final = job.load_checkpoint(result.final_checkpoint)
        if not before_final:
            assert final.manifest_keys() == set()
            return
        (key,) = final.manifest_keys()  # every subtask of every operator builds on it
        materialized = job.load_checkpoint(parse_manifest_key(key)[1])
    # the materialized checkpoint had read every record: the final one adds no source progress
    assert materialized.sources == final.sources, (materialized.sources, final.sources)
    assert materialized.checkpoint_id < final.checkpoint_id


def test_kills_with_the_materializer_in_the_background(file_root: RootSpec, tmp_path: Path) -> None:
    from materializer.background import start_background

    env = make_env(file_root)
    jobs.build_clicks(env, tmp_path / "windows", 6000, rate=2500)
    jobs.build_join(env, tmp_path / "join", 2400, order_rate=1000, payment_rate=1000)
    client = env.execute_async("materialized")
    assert client.wait_running(1, timeout=60)
    with start_background(file_root.url, interval_s=0.3, run_gc=False):
        kills = kill_workers(client, 2, random.Random(8), 0.8, 1.5)
        result = client.wait(180)
    assert kills.count == 2
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(6000)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(2400)
    with statelog.open(file_root.url) as job:
        final = job.load_checkpoint(result.final_checkpoint)
    # the workers adopted a materialization: the final checkpoint builds on one
    assert any(h.materialization for op in final.operators.values() for h in op.subtasks)
