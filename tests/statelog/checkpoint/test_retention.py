"""A checkpoint removed by the default retention (5) fails saying retention removed it and how to keep more."""

from __future__ import annotations

import pyarrow as pa
import pytest

import statelog
from statelog.errors import CheckpointNotFoundError
from tests.support.s3server import RootSpec


def _job_with_checkpoints(root: RootSpec, n: int) -> list[int]:
    with statelog.open(root.url) as job:  # the default retention
        b = job.backend("op")
        count = b.get_state(statelog.ValueStateDescriptor("count", pa.int64(), default=0))
        ids = []
        for i in range(n):
            b.set_current_key(f"k{i}")
            count.update(i)
            ids.append(job.checkpoint(sources={"s": i}).checkpoint_id)
        assert job.catalog.checkpoint_ids() == ids[-5:]  # the default keeps 5
    return ids


def test_an_expired_checkpoint_says_retention_removed_it(file_root: RootSpec) -> None:
    ids = _job_with_checkpoints(file_root, 7)
    with statelog.open(file_root.url, create=False) as job:
        with pytest.raises(CheckpointNotFoundError) as info:
            job.load_checkpoint(ids[0])
        message = str(info.value)
        assert f"checkpoint {ids[0]} does not exist" in message
        assert "retention removed it" in message
        assert "retain_checkpoints" in message and "default 5" in message and "savepoint" in message
        assert f"retained checkpoints: {', '.join(map(str, ids[2:]))}" in message
        with pytest.raises(CheckpointNotFoundError, match="retention removed it"):
            job.backend("op", restore=ids[1])
        # an id never published is not blamed on retention
        with pytest.raises(CheckpointNotFoundError) as info:
            job.load_checkpoint(ids[-1] + 10)
        assert "retention" not in str(info.value) and "pick one of those" in str(info.value)


def test_the_change_feed_from_an_expired_checkpoint_says_retention_removed_it(file_root: RootSpec) -> None:
    pytest.importorskip("pyspark")
    from statelog.readers.changes import plan_feed

    ids = _job_with_checkpoints(file_root, 6)
    with pytest.raises(CheckpointNotFoundError, match=r"retention removed it.*retain_checkpoints"):
        plan_feed({"root": file_root.url, "operator": "op", "state": "count", "changesFrom": str(ids[0])})
