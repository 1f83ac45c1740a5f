"""The state-dump baseline (``state_backend=StateDumpBackend()``, a runtime snapshot strategy):
same job, whole-state checkpoints."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import statelog
from bench.baselines.state_dump import decode_state_dump
from bench.baselines.state_dump_backend import StateDumpBackend
from runtime import FixedDelay, JobGraphError, NoRestart, StreamExecutionEnvironment
from runtime.connectors.sinks import read_committed
from statelog.keys.encoding import decode_key
from statelog.layout import STATE_DUMP_PREFIX as PREFIX
from tests.support import jobs
from tests.support.s3server import RootSpec


def test_state_dump_job_writes_whole_state_dumps_and_commits_its_sink(file_root: RootSpec, tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=0.2, state_root=file_root.url,
                                     state_backend=StateDumpBackend())
    jobs.build_deliveries(env, tmp_path / "out", 3000, rate=6000)
    result = env.execute("baseline", timeout_s=120)
    delivered = sorted(map(tuple, read_committed(tmp_path / "out")))
    assert delivered == [(k, i) for k in range(jobs.CLICK_SPLITS) for i in range(3000)]
    assert len(result.completed_checkpoints) >= 3
    stats = [result.checkpoint_stats[c] for c in result.completed_checkpoints]
    assert all(s["state_backend"] == "state-dump" for s in stats)
    assert any(s["incremental_bytes"] > 0 for s in stats)
    with statelog.open(file_root.url) as job:
        assert job.catalog.checkpoint_ids() == []  # nothing restorable is published
        keys = sorted(o.key for o in job.store.list(PREFIX))
        # older dumps are deleted when a checkpoint completes: one per subtask is left
        assert [k.rsplit("/", 2)[1] for k in keys] == ["00000", "00001"]
        assert all(k.endswith(f"{result.final_checkpoint:012d}.snapshot") for k in keys)
        seen: dict[str, int] = {}
        for k in keys:
            t = decode_state_dump(job.store.get(k), k)["seen"].to_pydict()
            for kb, v in zip(t["key"], t["value"], strict=True):
                seen[decode_key(kb)] = v
    # the final dump holds the whole state: every user's count of deliveries
    assert seen == Counter(jobs.make_click(k, i)[0] for k in range(jobs.CLICK_SPLITS) for i in range(3000))


def test_state_dump_backend_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    root = tmp_path.as_uri()
    baseline = StateDumpBackend()
    with pytest.raises(JobGraphError, match="unknown state_backend"):
        StreamExecutionEnvironment(state_root=root, state_backend="rocksdb")
    with pytest.raises(JobGraphError, match="cannot be restored"):
        StreamExecutionEnvironment(state_root=root, state_backend=baseline, restart_strategy=FixedDelay(1, 0))
    with pytest.raises(JobGraphError, match="nothing to materialize"):
        StreamExecutionEnvironment(state_root=root, state_backend=baseline, materializer=True)
    env = StreamExecutionEnvironment(state_root=root, state_backend=baseline, restart_strategy=NoRestart())
    assert isinstance(env.restart_strategy, NoRestart)
    jobs.build_clicks(env, tmp_path / "out", 10)
    with pytest.raises(JobGraphError, match="cannot restore"):
        env.execute_async("baseline", restore="latest")
