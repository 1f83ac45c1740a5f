"""Restores: from an older retained checkpoint and from a savepoint at another parallelism,
unknown operator uids, and jobs that run out of restarts or tolerable checkpoint failures."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import statelog
from materializer.savepoint import create_savepoint
from runtime import (
    CheckpointFailureLimitError,
    FileSink,
    FixedDelay,
    GeneratorSource,
    JobFailedError,
    NonRestoredStateError,
    NoRestart,
    StreamExecutionEnvironment,
    read_committed,
)
from tests.support import jobs
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec

CLICKS, ORDERS = 2400, 1600


def first_run(root: RootSpec, out: Path) -> list[int]:
    """The windows and the join at parallelism 2, paced to leave several checkpoints."""
    env = make_env(root, parallelism=2, checkpoint_interval_s=0.15, retain_checkpoints=50)
    jobs.build_clicks(env, out / "windows", CLICKS, rate=2500)
    jobs.build_join(env, out / "join", ORDERS, order_rate=1600, payment_rate=1600)
    result = env.execute("first", timeout_s=120)
    assert len(result.completed_checkpoints) >= 4, result.completed_checkpoints
    return result.completed_checkpoints


def assert_continued_exactly_once(first: Path, second: Path, cid: int) -> None:
    """The first run's output committed up to checkpoint ``cid`` plus the restored run's output
    is the golden output, exactly once."""
    windows = read_committed(first / "windows", upto_checkpoint=cid) + read_committed(second / "windows")
    assert sorted(windows) == jobs.golden_windows(CLICKS)
    joined = read_committed(first / "join", upto_checkpoint=cid) + read_committed(second / "join")
    assert sorted(joined) == jobs.golden_join(ORDERS)


@pytest.mark.parametrize("parallelism", [3, 1])
def test_restore_an_older_checkpoint_at_another_parallelism(
    file_root: RootSpec, tmp_path: Path, parallelism: int
) -> None:
    completed = first_run(file_root, tmp_path / "a")
    older = completed[len(completed) // 2 - 1]
    env = make_env(file_root, parallelism=parallelism)
    jobs.build_clicks(env, tmp_path / "b" / "windows", CLICKS)
    jobs.build_join(env, tmp_path / "b" / "join", ORDERS)
    result = env.execute("restored", restore=older, timeout_s=120)
    assert result.completed_checkpoints[0] > completed[-1]
    assert_continued_exactly_once(tmp_path / "a", tmp_path / "b", older)


@pytest.mark.parametrize("parallelism", [3, 1])
def test_restore_an_unaligned_checkpoint_with_inflight_data_at_another_parallelism(
    file_root: RootSpec, tmp_path: Path, parallelism: int
) -> None:
    """The in-flight records of an unaligned checkpoint are redistributed by key group and
    replayed before new input; the restored job (aligned) continues the output exactly once."""
    env = make_env(file_root, mode="exactly_once_unaligned", checkpoint_interval_s=0.1, retain_checkpoints=50)
    jobs.build_clicks(env, tmp_path / "a" / "windows", CLICKS, rate=2500)
    jobs.build_join(env, tmp_path / "a" / "join", ORDERS, order_rate=1600, payment_rate=1600)
    result = env.execute("first-unaligned", timeout_s=120)
    candidates = [c for c in result.completed_checkpoints[:-1]
                  if result.checkpoint_stats[c].get("inflight_bytes", 0) > 0]
    assert candidates, "no checkpoint with in-flight data"
    cid = candidates[len(candidates) // 2]
    env = make_env(file_root, parallelism=parallelism)
    jobs.build_clicks(env, tmp_path / "b" / "windows", CLICKS)
    jobs.build_join(env, tmp_path / "b" / "join", ORDERS)
    env.execute("restored", restore=cid, timeout_s=120)
    assert_continued_exactly_once(tmp_path / "a", tmp_path / "b", cid)


def test_restore_a_savepoint_at_another_parallelism(file_root: RootSpec, tmp_path: Path) -> None:
    completed = first_run(file_root, tmp_path / "a")
    cid = completed[1]
    with statelog.open(file_root.url) as job:
        create_savepoint(job.store, cid, "before-the-end")
    env = make_env(file_root, parallelism=3)
    jobs.build_clicks(env, tmp_path / "b" / "windows", CLICKS)
    jobs.build_join(env, tmp_path / "b" / "join", ORDERS)
    env.execute("from-savepoint", restore="savepoint:before-the-end", timeout_s=120)
    assert_continued_exactly_once(tmp_path / "a", tmp_path / "b", cid)


def test_stop_with_savepoint_then_resume_at_another_parallelism(file_root: RootSpec, tmp_path: Path) -> None:
    env = make_env(file_root, parallelism=2)
    jobs.build_clicks(env, tmp_path / "windows", CLICKS, rate=1200)
    jobs.build_join(env, tmp_path / "join", ORDERS, order_rate=800, payment_rate=800)
    client = env.execute_async("stopped")
    assert client.wait_running(1, timeout=60)
    result = client.stop_with_savepoint("stop-1", timeout=120)
    assert result.savepoint == "stop-1"
    with statelog.open(file_root.url) as job:
        positions = job.load_savepoint("stop-1").sources["clicks"]
    assert sum(p["next"] for p in positions.values()) < CLICKS * jobs.CLICK_SPLITS  # stopped mid-way
    env = make_env(file_root, parallelism=1)
    jobs.build_clicks(env, tmp_path / "windows", CLICKS)
    jobs.build_join(env, tmp_path / "join", ORDERS)
    env.execute("resumed", restore="savepoint:stop-1", timeout_s=120)
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(CLICKS)
    assert sorted(read_committed(tmp_path / "join")) == jobs.golden_join(ORDERS)


def test_unknown_operator_uid_fails_unless_allowed(file_root: RootSpec, tmp_path: Path) -> None:
    completed = first_run(file_root, tmp_path / "a")
    cid = completed[1]

    def join_only() -> StreamExecutionEnvironment:
        env = make_env(file_root, parallelism=2)
        jobs.build_join(env, tmp_path / "b" / "join", ORDERS)
        return env

    with pytest.raises(NonRestoredStateError, match="window-count"):
        join_only().execute("missing", restore=cid, timeout_s=60)
    join_only().execute("allowed", restore=cid, allow_non_restored_state=True, timeout_s=120)
    joined = read_committed(tmp_path / "a" / "join", upto_checkpoint=cid) + read_committed(tmp_path / "b" / "join")
    assert sorted(joined) == jobs.golden_join(ORDERS)


def test_a_job_without_restarts_left_fails(file_root: RootSpec, tmp_path: Path) -> None:
    env = make_env(file_root, restart_strategy=NoRestart())
    jobs.build_clicks(env, tmp_path / "windows", 100_000, rate=2000)
    client = env.execute_async("no-restart")
    assert client.wait_running(1, timeout=60)
    os.kill(client.worker_pids()[0], signal.SIGKILL)
    with pytest.raises(JobFailedError, match="WorkerLostError"):
        client.wait(60)


def test_checkpoint_failures_beyond_the_tolerance_restart_then_fail(file_root: RootSpec, tmp_path: Path) -> None:
    # a timeout no checkpoint can meet: each attempt fails after 2 tolerated failures
    env = make_env(
        file_root,
        checkpoint_interval_s=0.05,
        checkpoint_timeout_s=1e-3,  # the smallest allowed: below any checkpoint (fsync + barrier)
        tolerable_failed_checkpoints=2,
        restart_strategy=FixedDelay(attempts=1, delay_s=0.0),
    )
    jobs.build_clicks(env, tmp_path / "windows", 100_000, rate=2000)
    with pytest.raises(JobFailedError) as info:
        env.execute("timeouts", timeout_s=60)
    assert isinstance(info.value.__cause__, CheckpointFailureLimitError)
    assert "3 checkpoints failed in a row" in str(info.value)
    assert read_committed(tmp_path / "windows") == []


def test_a_failing_user_function_exhausts_the_restarts_with_its_traceback(
    file_root: RootSpec, tmp_path: Path
) -> None:
    env = make_env(file_root, restart_strategy=FixedDelay(attempts=1, delay_s=0.0))
    orders = env.from_source(GeneratorSource(jobs.make_order, 100, splits=1), uid="orders")
    orders.map(jobs.explode_on_order_7).sink_to(FileSink(tmp_path / "out"), uid="out")
    with pytest.raises(JobFailedError, match="boom: order 0-7") as info:
        env.execute("boom", timeout_s=60)
    assert "attempt 2" in str(info.value) and "explode_on_order_7" in str(info.value)
