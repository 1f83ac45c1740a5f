"""The follower's model test: a writer doing random operations on every state kind, TTL and
timers publishes checkpoints, is killed at random (closed without flushing or checkpointing)
and restarts from a retained checkpoint (the newest or an earlier one), and sometimes builds
on a materialization; a follower polls, and is closed and reopened at random. Whenever the
follower reports checkpoint n, its state equals the model at n exactly; with "flushed", the
model at n plus, per state, a prefix of the operations its writer did after n (each state
has its own changelog stream, flushed on its own)."""

from __future__ import annotations

import random
from typing import Any

import pytest

import statelog
from materializer.build import materialize
from statelog.following.follower import Follower
from tests.support.follow_writer import KEYS, model_state, random_op, state_of
from tests.support.harness import DESCRIPTORS, Clock, Driver, Model
from tests.support.s3server import RootSpec

UID = "op"


class Scenario:
    def __init__(self, root: RootSpec, seed: int, consistency: str) -> None:
        self.root, self.rng, self.consistency = root, random.Random(seed), consistency
        self.clock = Clock()
        self.model = Model()
        self.at: dict[int, Model] = {}  # checkpoint id -> the model at it
        # checkpoint id -> the model after each operation its writer did after it (until it died)
        self.after: dict[int, list[Model]] = {}
        self.last: int | None = None  # the newest checkpoint of the live writer
        self.checked = {"exact": 0, "flushed": 0}
        self.job: Any = None
        self._start_writer("none")

    def _start_writer(self, restore: Any) -> None:
        self.job = statelog.open(self.root.url, store_options=self.root.options, max_parallelism=16,
                                 retain_checkpoints=3, writer_lease_ttl_s=2.0)  # fmt: skip
        self.job.materialization_poll_s = 0.0
        self.driver = Driver(self.job.backend(UID, restore=restore, clock=self.clock), self.model, self.clock)
        self.driver.set_key(self.rng.choice(KEYS))
        self.last = None

    def follower(self) -> Follower:
        return statelog.follow(self.root.url, store_options=self.root.options, operators={UID: DESCRIPTORS.values()},
                               consistency=self.consistency, poll_s=None, clock=self.clock,
                               on_demand=self.rng.random() < 0.5)  # fmt: skip

    def op(self, n: int) -> None:
        self.driver.apply(random_op(self.rng, n))
        if self.last is not None:
            self.after[self.last].append(self.model.copy())

    def checkpoint(self) -> None:
        meta = self.job.checkpoint(sources={"n": 0})
        self.last = meta.checkpoint_id
        self.at[meta.checkpoint_id] = self.model.copy()
        self.after[meta.checkpoint_id] = []

    def kill_and_restart(self) -> None:
        self.job.close(flush=False)  # what was not checkpointed is lost (what was flushed stays in the store)
        ids = self.job.catalog.checkpoint_ids()
        if not ids:
            self.model = Model()
            self._start_writer("none")
            return
        cid = ids[-1] if self.rng.random() < 0.6 else self.rng.choice(ids)
        self.model = self.at[cid].copy()
        self._start_writer(cid)

    def materialize(self) -> None:
        meta = self.job.latest_checkpoint()
        if meta is not None:
            materialize(self.job.store, meta)

    def check(self, f: Follower) -> None:
        pos = f.position
        if pos.checkpoint_id is None:
            return
        got = state_of(f)
        n = pos.checkpoint_id
        if pos.exact:
            assert got == model_state(self.at[n], self.clock.now), f"state at checkpoint {n} differs"
            self.checked["exact"] += 1
            return
        assert self.consistency == "flushed", pos
        # each state (and timer domain) has its own changelog stream, flushed on its own: per
        # stream, a prefix of what the writer did after n
        prefixes = [model_state(m, self.clock.now) for m in [self.at[n], *self.after[n]]]
        for name, table in got[0].items():
            assert any(p[0][name] == table for p in prefixes), f"state {name!r} at checkpoint {n} + flushed: no prefix"
        for domain in ("event", "processing"):
            mine = {t for t in got[1] if t[0] == domain}
            assert any({t for t in p[1] if t[0] == domain} == mine for p in prefixes), f"{domain} timers: no prefix"
        self.checked["flushed"] += 1


@pytest.mark.parametrize("consistency", ["checkpoint", "flushed"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_follower_state_equals_the_model_at_its_checkpoint(file_root: RootSpec, seed: int, consistency: str) -> None:
    s = Scenario(file_root, seed, consistency)
    rng = s.rng
    f = s.follower()
    restores = 0
    for n in range(400):
        r = rng.random()
        if r < 0.70:
            s.op(n)
        elif r < 0.80:
            s.checkpoint()
        elif r < 0.83:
            s.kill_and_restart()
        elif r < 0.85:
            s.materialize()
        elif r < 0.95:
            f.poll()
            s.check(f)
        else:
            restores += f.position.restores
            f.close()
            f = s.follower()
            s.check(f)
        if consistency == "flushed" and r < 0.70 and rng.random() < 0.2:
            s.job.flush_soon()
    f.poll()
    s.check(f)
    restores += f.position.restores
    f.close()
    s.job.close()
    assert s.checked["exact"] >= 10, s.checked
    if consistency == "flushed":
        assert s.checked["flushed"] >= 1, s.checked
