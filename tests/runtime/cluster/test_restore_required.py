"""A job started again on a root that already has checkpoints must say where to start:
without ``restore=`` it is refused before any output is written, instead
of starting from empty state and writing the sink's output a second time (512 -> 1,024 records)."""

from __future__ import annotations

from pathlib import Path

import pytest

import statelog
from runtime import read_committed
from statelog.errors import RestoreRequiredError
from tests.support import jobs
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec

ORDERS = 256  # per split, two splits: 512 joined records


def run_join(root: RootSpec, out: Path, **execute: object) -> object:
    env = make_env(root, parallelism=1, checkpoint_interval_s=0.1)
    jobs.build_join(env, out, ORDERS)
    return env.execute("join", timeout_s=120, **execute)  # type: ignore[arg-type]


def test_a_second_run_without_restore_is_refused(file_root: RootSpec, tmp_path: Path) -> None:
    out = tmp_path / "join"
    first = run_join(file_root, out)
    assert len(read_committed(out)) == 2 * ORDERS
    with statelog.open(file_root.url) as job:
        latest = job.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == first.final_checkpoint  # type: ignore[attr-defined]

    with pytest.raises(RestoreRequiredError) as err:
        run_join(file_root, out)
    msg = str(err.value)
    assert f"checkpoint {latest.checkpoint_id}" in msg
    assert "restore='latest'" in msg and "restore='none'" in msg
    assert len(read_committed(out)) == 2 * ORDERS  # nothing was written twice

    # the explicit choices: continue from the latest checkpoint (nothing left to read) ...
    run_join(file_root, out, restore="latest")
    assert sorted(read_committed(out)) == jobs.golden_join(ORDERS)
    # ... or start fresh on purpose (the sink then writes everything again, as asked)
    fresh = tmp_path / "fresh"
    run_join(file_root, fresh, restore="none")
    assert sorted(read_committed(fresh)) == jobs.golden_join(ORDERS)


def test_restore_latest_on_an_empty_root_and_none_start_empty(file_root: RootSpec, tmp_path: Path) -> None:
    run_join(file_root, tmp_path / "a", restore="none")
    assert sorted(read_committed(tmp_path / "a")) == jobs.golden_join(ORDERS)
