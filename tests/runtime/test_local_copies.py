"""Task-local recovery in the runtime: workers keep local copies of what they write, and the
workers of the next attempt restore from them instead of the store."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from runtime import read_committed
from runtime.errors import JobGraphError
from statelog.errors import ConfigError
from tests.support import jobs
from tests.support.chaos import kill_workers
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec


def test_a_restarted_attempt_restores_from_the_copies_its_predecessor_wrote(file_root: RootSpec, tmp_path: Path) -> None:
    copies = tmp_path / "copies"
    env = make_env(file_root, local_copies={"directory": str(copies), "budget_bytes": 1 << 28})
    jobs.build_clicks(env, tmp_path / "windows", 3000, rate=2500)
    client = env.execute_async("local-copies")
    kills = kill_workers(client, 1, random.Random(3), 0.8, 1.2)
    result = client.wait(180)
    assert kills.count == 1 and result.restarts >= 1
    assert sorted(read_committed(tmp_path / "windows")) == jobs.golden_windows(3000)
    restored = [st for st in result.restore_stats.values() if "objects_local" in st]
    assert restored, result.restore_stats
    # every object the restore needed was written on this host: none came from the store
    assert all(st["objects_local"] > 0 and st["objects_remote"] == 0 for st in restored), restored
    assert all(st["bytes_local"] > 0 for st in restored)
    assert any(copies.rglob("*.seg"))


@pytest.mark.parametrize("bad", [{"dir": "/x"}, 7, {"budget_bytes": "1GB"}])
def test_bad_local_copies_are_refused_before_the_job_starts(file_root: RootSpec, bad: object) -> None:
    with pytest.raises((ConfigError, JobGraphError), match="local_copies"):
        make_env(file_root, local_copies=bad)
