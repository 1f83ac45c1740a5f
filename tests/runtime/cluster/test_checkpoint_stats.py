"""Checkpoint statistics of a runtime job: what each checkpoint says it uploaded is the new
changelog it references (a final checkpoint once said ``0 B``)."""

from __future__ import annotations

from pathlib import Path

import statelog
from runtime import StreamExecutionEnvironment
from statelog.checkpoint.metadata import CheckpointMetadata
from tests.support import jobs


def referenced_segments(meta: CheckpointMetadata) -> dict[str, int]:
    return {
        s.name: s.size
        for op in meta.operators.values()
        for h in op.subtasks
        for r in h.changelog
        for s in r.segments
    }


def test_each_checkpoint_reports_the_new_changelog_bytes_it_references(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    env = StreamExecutionEnvironment(state_root=root, parallelism=2, checkpoint_interval_s=0.2)
    jobs.build_clicks(env, tmp_path / "out", 1500)
    result = env.execute("stats", timeout_s=120)
    assert result.final_checkpoint is not None
    with statelog.open(root) as job:
        metas = [job.load_checkpoint(cid) for cid in result.completed_checkpoints]
    previous: dict[str, int] = {}
    for meta in metas:
        segments = referenced_segments(meta)
        new = sum(size for name, size in segments.items() if name not in previous)
        assert meta.stats["incremental_bytes"] == new, (meta.checkpoint_id, meta.stats)
        assert result.checkpoint_stats[meta.checkpoint_id]["incremental_bytes"] == new
        previous = segments
    final = metas[-1]
    assert final.checkpoint_id == result.final_checkpoint and final.stats["final"] is True
    # the final checkpoint seals the last windows' changes: it references new changelog
    assert final.stats["incremental_bytes"] > 0
