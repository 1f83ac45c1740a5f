"""The hot standby (``statelog.open(root, standby=True)``): it follows the root until the
writer lease is free, then continues from its replica, without a restore, with exactly the
state of the newest completed checkpoint (every state kind, TTL and timers), and its own
checkpoints restore to what it holds."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog.errors import ConfigError
from statelog.following import standby
from tests.support.s3server import RootSpec
from tests.support.state_kinds import every_state_kind

UID = "counter"
KEYS = [*range(40), "user-a", (3, "x")]
NAMESPACES = [None, "w1"]
CLOCK_MS = 10**9
DESCRIPTORS = every_state_kind(CLOCK_MS)  # one set: an aggregate function object is part of its descriptor


def update(backend: statelog.KeyedStateBackend, states: dict[str, Any], rng: random.Random, n: int) -> None:
    for _ in range(n):
        backend.set_current_key(rng.choice(KEYS))
        ns = rng.choice(NAMESPACES)
        for st in states.values():
            st.set_namespace(ns)
        v = rng.randrange(100)
        states["count"].update(states["count"].value() + v)
        states["seen"].add(f"e{v}")
        states["attrs"].put(f"a{v % 4}", v) if v % 5 else states["attrs"].remove("a1")
        states["total"].add(v)
        states["avg"].add(v)
        states["ttl_v"].update(v)
        states["ttl_m"].put(f"m{v % 3}", [v])
        if v % 7 == 0:
            backend.timers.register_event_time_timer(v, ns)


def view(backend: statelog.KeyedStateBackend) -> dict[Any, Any]:
    """Every state at every key and namespace, and the timers."""
    states = {d.name: backend.get_state(d) for d in DESCRIPTORS}
    out: dict[Any, Any] = {}
    for key in KEYS:
        backend.set_current_key(key)
        for ns in NAMESPACES:
            for name, st in states.items():
                st.set_namespace(ns)
                if hasattr(st, "items"):
                    out[(name, key, ns)] = dict(st.items())
                elif hasattr(st, "get"):
                    out[(name, key, ns)] = st.get()
                else:
                    out[(name, key, ns)] = st.value()
    out["timers"] = sorted(map(repr, backend.timers.timers("event")))
    return out


def restored_view(root: RootSpec, checkpoint_id: int) -> dict[Any, Any]:
    """restore(checkpoint_id), by a process that does not write."""
    with statelog.open(root.url, store_options=root.options, writer_lease=False) as job:
        backend = job.backend(UID, restore=checkpoint_id, changelog=False, clock=lambda: CLOCK_MS)
        return view(backend)


class Standby(threading.Thread):
    """``statelog.open(root, standby=True)`` in a thread (it returns once it took over)."""

    def __init__(self, root: RootSpec, **options: Any) -> None:
        super().__init__(daemon=True)
        self.root, self.options = root, options
        self.job: statelog.StateJob | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.job = statelog.open(self.root.url, store_options=self.root.options, standby=True, **self.options)
        except BaseException as e:  # noqa: BLE001 - reported by took_over
            self.error = e

    def took_over(self, timeout: float = 60.0) -> statelog.StateJob:
        self.join(timeout)
        assert not self.is_alive(), "the standby did not take over"
        assert self.error is None, self.error
        assert self.job is not None
        return self.job


def writer(root: RootSpec) -> tuple[statelog.StateJob, statelog.KeyedStateBackend, dict[str, Any]]:
    job = statelog.open(root.url, store_options=root.options, max_parallelism=32, writer_lease_ttl_s=1.0)
    backend = job.backend(UID, restore="latest", clock=lambda: CLOCK_MS)
    return job, backend, {d.name: backend.get_state(d) for d in DESCRIPTORS}


@pytest.mark.parametrize("state_store", ["memory", "disk"])
def test_clean_close_takeover_continues_from_the_replica(file_root: RootSpec, state_store: str, tmp_path: Path) -> None:
    rng = random.Random(7)
    job, backend, states = writer(file_root)
    update(backend, states, rng, 200)
    job.checkpoint(sources={"in": 200})
    sb = Standby(file_root, state_store=state_store, state_dir=str(tmp_path / "standby"))
    for i in range(3):
        update(backend, states, rng, 100)
        last = job.checkpoint(sources={"in": 300 + 100 * i})
    update(backend, states, rng, 50)  # not in any checkpoint: the standby must not have it
    assert sb.is_alive()  # the lease is held: it follows
    job.close()  # releases the lease
    new = sb.took_over()
    try:
        assert new.takeover is not None and new.takeover.meta is not None
        assert new.takeover.meta.checkpoint_id == last.checkpoint_id
        taken = new.backend(UID, restore="latest", clock=lambda: CLOCK_MS)
        assert taken.restore_stats.get("standby") is True  # the replica, not a restore
        assert taken.on_disk == (state_store == "disk")
        assert view(taken) == restored_view(file_root, last.checkpoint_id)
        # it writes on: its checkpoints build on the one it took over and restore to its state
        states2 = {d.name: taken.get_state(d) for d in DESCRIPTORS}
        update(taken, states2, rng, 150)
        meta = new.checkpoint(sources={"in": 1000})
        assert meta.checkpoint_id > last.checkpoint_id and meta.writer_generation > last.writer_generation
        assert view(taken) == restored_view(file_root, meta.checkpoint_id)
    finally:
        new.close()


def test_a_checkpoint_published_after_the_last_poll_is_applied_before_continuing(
    file_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(standby, "DEFAULT_STANDBY_POLL_S", 3600.0)  # the follower polls once, at start
    rng = random.Random(3)
    job, backend, states = writer(file_root)
    update(backend, states, rng, 100)
    first = job.checkpoint()
    sb = Standby(file_root)
    while sb.is_alive() and not any(t.name == "statelog-follow" for t in threading.enumerate()):
        sb.join(0.01)  # until its follower runs (restored the first checkpoint)
    update(backend, states, rng, 100)
    last = job.checkpoint()
    job.close()
    new = sb.took_over()
    try:
        assert new.takeover is not None and new.takeover.meta is not None
        assert new.takeover.meta.checkpoint_id == last.checkpoint_id > first.checkpoint_id
        taken = new.backend(UID, restore="latest", clock=lambda: CLOCK_MS)
        assert view(taken) == restored_view(file_root, last.checkpoint_id)
    finally:
        new.close()


def test_a_standby_asked_for_another_checkpoint_or_type_does_not_hand_over_its_replica(file_root: RootSpec) -> None:
    job, backend, states = writer(file_root)
    update(backend, states, random.Random(1), 100)
    first = job.checkpoint()
    update(backend, states, random.Random(2), 100)
    job.checkpoint()
    sb = Standby(file_root)
    job.close()
    new = sb.took_over()
    try:
        older = new.backend(UID, restore=first.checkpoint_id, clock=lambda: CLOCK_MS)
        assert "standby" not in older.restore_stats  # a restore of what was asked for
        assert view(older) == restored_view(file_root, first.checkpoint_id)
    finally:
        new.close()
    sb = Standby(file_root)
    new = sb.took_over()
    try:
        taken = new.backend(UID, restore="latest")
        with pytest.raises(ConfigError, match="state 'count' is stored as"):
            taken.get_state(statelog.ValueStateDescriptor("count", pa.string()))
    finally:
        new.close()


def test_standby_needs_the_writer_lease(file_root: RootSpec) -> None:
    with pytest.raises(ConfigError, match="standby=True .* needs writer_lease=True"):
        statelog.open(file_root.url, standby=True, writer_lease=False)
