"""The follower's model test with writers killed by SIGKILL: a writer process
(``tests/support/follow_writer.py``) applies a deterministic sequence of operations on
every state kind, TTL and timers and checkpoints every few operations until it is killed;
the next one restores the latest checkpoint and goes on. The follower (closed and reopened
at random) polls meanwhile: whenever it reports checkpoint n, its state equals the model
after the operations checkpoint n holds."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import statelog
from statelog.checkpoint.catalog import JobCatalog
from statelog.errors import CheckpointNotFoundError, ObjectNotFoundError
from statelog.following.follower import Follower
from tests.support.follow_writer import UID, model_at, model_state, state_of
from tests.support.harness import DESCRIPTORS, Clock
from tests.support.s3server import RootSpec

REPO = Path(__file__).resolve().parents[3]
SEED = 11


def test_follower_state_equals_the_model_while_writers_are_killed(file_root: RootSpec) -> None:
    rng = random.Random(SEED)
    clock = Clock()
    ops_at: dict[int, int] = {}  # checkpoint id -> operations it holds
    checked: set[int] = set()
    f: Follower | None = None
    catalog: JobCatalog | None = None

    def check() -> None:
        assert f is not None and catalog is not None
        pos = f.poll()
        n_id = pos.checkpoint_id
        if n_id is None:
            return
        if n_id not in ops_at:  # published, but the writer was killed before it said so
            try:
                ops_at[n_id] = int(catalog.load(n_id).sources["n"])
            except (CheckpointNotFoundError, ObjectNotFoundError):
                return  # (removed by retention meanwhile)
        driver, at = model_at(SEED, ops_at[n_id])
        clock.now = at.now
        assert state_of(f) == model_state(driver.model, at.now), f"state at checkpoint {n_id} differs"
        checked.add(n_id)

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _round in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.follow_writer", file_root.url, str(SEED)],
            stdout=subprocess.PIPE, text=True, cwd=REPO, env=env,
        )  # fmt: skip
        try:
            for _ in range(rng.randrange(2, 6)):
                line = proc.stdout.readline() if proc.stdout else ""
                assert line.startswith("CHECKPOINT "), f"the writer said {line!r} (exit {proc.poll()})"
                _, cid, n = line.split()
                ops_at[int(cid)] = int(n)
                if f is None:
                    f = statelog.follow(file_root.url, operators={UID: DESCRIPTORS.values()}, poll_s=None, clock=clock)
                    catalog = JobCatalog(file_root.open())
                check()
            time.sleep(rng.random() * 0.2)  # killed anywhere: between operations, checkpoints, uploads
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
        check()
        if rng.random() < 0.5:
            assert f is not None
            f.close()
            f = statelog.follow(file_root.url, operators={UID: DESCRIPTORS.values()}, poll_s=None, clock=clock)
            check()
    assert f is not None
    f.close()
    assert len(checked) >= 5, f"only checkpoints {sorted(checked)} were checked"
