"""A follower's state equals the writer's at the checkpoint it reports, for every state kind;
"flushed" sees changes before the next checkpoint; it restores again when the job restored
an earlier checkpoint or its changelog was materialized and collected."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from materializer.gc.collect import collect_garbage
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    StateKind,
)
from statelog.following.position import Consistency
from statelog.state.kinds import ReducingState
from tests.support.s3server import RootSpec
from tests.support.state_kinds import every_state_kind
from tests.support.wait import wait_until

UID = "counter"
KEYS = [*range(30), "user-a", "user-b", (3, "x")]
NAMESPACES = [None, "w1"]


def _read(state: Any, kind: StateKind) -> Any:
    """What Follower.get returns for a state kind, read from the writer's state."""
    if kind is StateKind.LIST:
        return state.get()
    if kind is StateKind.MAP:
        return dict(state.items())
    if isinstance(state, ReducingState):
        return state.get()
    return state.value() if kind is not StateKind.AGGREGATING else state.get()


class Writer:
    """A consumer loop over every state kind: random updates, checkpoints."""

    def __init__(self, root: RootSpec, restore: Any = "none", seed: int = 0) -> None:
        self.job = statelog.open(root.url, store_options=root.options, max_parallelism=32)
        self.backend = self.job.backend(UID, restore=restore)
        self.descriptors = every_state_kind(10**9)
        self.states = {d.name: self.backend.get_state(d) for d in self.descriptors}
        self.rng = random.Random(seed)

    def kind(self, name: str) -> StateKind:
        d = next(d for d in self.descriptors if d.name == name)
        if isinstance(d, ListStateDescriptor):
            return StateKind.LIST
        if isinstance(d, MapStateDescriptor):
            return StateKind.MAP
        if isinstance(d, AggregatingStateDescriptor):
            return StateKind.AGGREGATING
        return StateKind.VALUE

    def update(self, n: int) -> None:
        rng, s = self.rng, self.states
        for i in range(n):
            self.backend.set_current_key(rng.choice(KEYS))
            ns = rng.choice(NAMESPACES)
            for st in s.values():
                st.set_namespace(ns)
            v = rng.randrange(100)
            s["count"].update(s["count"].value() + v)
            s["seen"].add(f"e{v}") if v % 3 else s["seen"].update([f"r{v}"])
            s["attrs"].put(f"a{v % 4}", v) if v % 5 else s["attrs"].remove("a1")
            s["total"].add(v)
            s["avg"].add(v)
            s["blob"].update({"v": v, "i": i})
            s["ttl_v"].update(v)
            s["ttl_l"].add(v)
            s["ttl_m"].put(f"m{v % 3}", [v])
            s["pmap"].put((v % 2, "k"), str(v))
            if v % 11 == 0:
                s["count"].clear()

    def view(self) -> dict[tuple[str, Any, Any], Any]:
        """Every state at every key and namespace, as Follower.get reads them."""
        out = {}
        for key in KEYS:
            self.backend.set_current_key(key)
            for ns in NAMESPACES:
                for name, st in self.states.items():
                    st.set_namespace(ns)
                    out[(name, key, ns)] = _read(st, self.kind(name))
        return out

    def close(self, flush: bool = True) -> None:
        self.job.close(flush=flush)


def follower_view(follower: statelog.Follower) -> dict[tuple[str, Any, Any], Any]:
    return {
        (d.name, key, ns): follower.get(UID, d.name, key, ns)
        for d in every_state_kind(10**9) for key in KEYS for ns in NAMESPACES
    }  # fmt: skip


@pytest.mark.parametrize("state_store", ["memory", "disk"])
def test_follower_state_is_the_writers_at_each_checkpoint(file_root: RootSpec, state_store: str, tmp_path) -> None:
    w = Writer(file_root)
    w.update(50)
    w.job.checkpoint()
    descriptors = {UID: every_state_kind(10**9)}
    with statelog.follow(file_root.url, operators=descriptors, poll_s=0.02, state_store=state_store,
                         state_dir=str(tmp_path / "follower")) as f:  # fmt: skip
        for _round in range(5):
            w.update(80)
            meta = w.job.checkpoint()
            want = w.view()
            pos = f.wait_for(meta.checkpoint_id)
            assert pos.checkpoint_id == meta.checkpoint_id and pos.exact
            assert pos.consistency is Consistency.CHECKPOINT and pos.lag_checkpoints == 0
            assert follower_view(f) == want
            for d in every_state_kind(10**9):  # read a batch at a time: a column at a time where it can be
                for ns in NAMESPACES:
                    assert f.read_many(UID, d.name, KEYS, ns).value == [want[(d.name, k, ns)] for k in KEYS], (d.name, ns)
        # a value state of an Arrow value type is read as a column; pickled values and TTL key by key
        assert isinstance(f.read_column(UID, "count", KEYS).value, pa.Array)
        assert isinstance(f.read_column(UID, "blob", KEYS).value, list)
        assert isinstance(f.read_column(UID, "ttl_v", KEYS).value, list)
        assert f.position.restores == 1  # it kept up: only the first restore
    w.close()


def test_without_descriptors_the_follower_reads_stored_values(file_root: RootSpec) -> None:
    w = Writer(file_root)
    w.update(40)
    w.job.checkpoint()
    with statelog.follow(file_root.url, poll_s=None) as f:
        w.backend.set_current_key(5)
        for st in w.states.values():
            st.set_namespace(None)
        assert f.get(UID, "avg", 5) == w.states["avg"].accumulator()  # no aggregate function: the accumulator
        assert f.get(UID, "attrs", 5) == dict(w.states["attrs"].items())
        with pytest.raises(statelog.StatelogError, match="no state 'nope'.*its states: "):
            f.get(UID, "nope", 5)
        with pytest.raises(statelog.StatelogError, match="no state of operator 'other'"):
            f.get("other", "count", 5)
    w.close()


def test_flushed_sees_changes_before_the_next_checkpoint(file_root: RootSpec) -> None:
    w = Writer(file_root)
    w.update(30)
    meta = w.job.checkpoint()
    at_checkpoint = w.view()
    descriptors = {UID: every_state_kind(10**9)}
    flushed = statelog.follow(file_root.url, operators=descriptors, consistency="flushed", poll_s=None)
    exact = statelog.follow(file_root.url, operators=descriptors, poll_s=None)
    w.update(40)
    w.job.flush_soon()
    newer = w.view()
    wait_until(lambda: flushed.poll().flushed_records > 0, 30, "the follower applied the flushed changelog")
    # the whole flush is in one segment here, so the state is the writer's now
    wait_until(lambda: flushed.poll() and follower_view(flushed) == newer, 30, "all flushed changes applied")
    r = flushed.read(UID, "count", 3)
    assert r.checkpoint_id == meta.checkpoint_id and r.flushed_records > 0
    assert exact.poll().exact and follower_view(exact) == at_checkpoint  # "checkpoint" never sees them
    meta2 = w.job.checkpoint()
    pos = flushed.poll()
    assert pos.checkpoint_id == meta2.checkpoint_id and pos.exact and follower_view(flushed) == newer
    assert pos.restores == 1
    flushed.close()
    exact.close()
    w.close()


def test_flushed_follower_moves_back_when_the_writer_fails(file_root: RootSpec) -> None:
    """Flushed changes after checkpoint n are lost with the writer; the next writer restores n:
    the follower restores again and its state is the new checkpoint's."""
    w = Writer(file_root, seed=1)
    w.update(30)
    meta = w.job.checkpoint()
    f = statelog.follow(file_root.url, operators={UID: every_state_kind(10**9)}, consistency="flushed", poll_s=None)
    w.update(40)
    w.job.flush_soon()
    wait_until(lambda: f.poll().flushed_records > 0, 30, "the follower applied the flushed changelog")
    w.close(flush=False)  # the writer fails: what it flushed after the checkpoint is not in any checkpoint
    w = Writer(file_root, restore=meta.checkpoint_id, seed=2)
    w.update(20)
    meta2 = w.job.checkpoint()
    pos = f.poll()
    assert pos.checkpoint_id == meta2.checkpoint_id and pos.exact and pos.restores == 2
    assert "restored an earlier checkpoint" in (f.last_restore_reason or "")
    assert follower_view(f) == w.view()
    f.close()
    w.close()


def test_follower_restores_again_when_the_job_restores_an_earlier_checkpoint(file_root: RootSpec, caplog) -> None:
    w = Writer(file_root)
    w.update(30)
    first = w.job.checkpoint()
    w.update(30)
    w.job.checkpoint()
    f = statelog.follow(file_root.url, operators={UID: every_state_kind(10**9)}, poll_s=None)
    w.close()
    w = Writer(file_root, restore=first.checkpoint_id, seed=5)  # another lineage: first, then other changes
    w.update(30)
    meta = w.job.checkpoint()
    pos = f.poll()
    assert pos.checkpoint_id == meta.checkpoint_id and pos.restores == 2
    assert follower_view(f) == w.view()
    assert f"restored checkpoint {meta.checkpoint_id} again" in caplog.text
    # from there on it catches up again without a restore
    w.update(30)
    meta = w.job.checkpoint()
    assert f.poll().restores == 2 and follower_view(f) == w.view()
    f.close()
    w.close()


def test_follower_restores_again_when_what_it_needs_was_collected(file_root: RootSpec) -> None:
    w = Writer(file_root)
    w.job.retain_checkpoints = 1
    w.update(30)
    w.job.checkpoint()
    f = statelog.follow(file_root.url, operators={UID: every_state_kind(10**9)}, poll_s=None)
    for _ in range(2):
        w.update(30)
        meta = w.job.checkpoint()
    materialize(w.job.store, meta)
    w.job.materialization_poll_s = 0.0
    w.update(30)
    meta = w.job.checkpoint()  # builds on the materialization: the changelog before it is not referenced
    assert meta.manifest_keys()
    report = collect_garbage(w.job.store, retain_checkpoints=1, grace_s=0)
    assert report.deleted
    pos = f.poll()
    assert pos.checkpoint_id == meta.checkpoint_id and pos.restores == 2
    assert "materialized" in (f.last_restore_reason or "")
    assert follower_view(f) == w.view()
    f.close()
    w.close()


def test_follower_never_writes_to_the_root(file_root: RootSpec) -> None:
    w = Writer(file_root)
    w.update(20)
    w.job.checkpoint()
    store = file_root.open()
    before = {(o.key, o.size, o.mtime) for o in store.list("")}
    with statelog.follow(file_root.url, consistency="flushed", poll_s=None) as f:
        w.update(20)
        w.job.checkpoint()
        f.poll()
    w.job.flush_soon()
    after = {(o.key, o.size, o.mtime) for o in store.list("")}
    w.close()
    ours = after - before
    assert all(k.startswith(("changelog/", "checkpoints/", "leases/", "history/")) for k, _s, _m in ours), ours


def test_bad_options_are_refused(file_root: RootSpec) -> None:
    Writer(file_root).close()
    with pytest.raises(statelog.StatelogError, match="consistency must be one of 'checkpoint', 'flushed', got 'fresh'"):
        statelog.follow(file_root.url, consistency="fresh")
    with pytest.raises(statelog.StatelogError, match="poll_s must be a positive number"):
        statelog.follow(file_root.url, poll_s=0)
    with pytest.raises(statelog.StatelogError, match="state_store"):
        statelog.follow(file_root.url, state_store="tape")
    with statelog.follow(file_root.url, poll_s=None) as f:  # no checkpoint yet
        assert f.position.checkpoint_id is None
        with pytest.raises(statelog.StatelogError, match="no completed checkpoint yet"):
            f.get(UID, "count", 1)


def test_follower_on_each_store(store_root: RootSpec) -> None:
    """On S3 as on files: the first restore, then each checkpoint's changelog, and flushed changes."""
    w = Writer(store_root, seed=7)
    w.update(30)
    w.job.checkpoint()
    descriptors = {UID: every_state_kind(10**9)}
    opts = store_root.options
    with statelog.follow(store_root.url, store_options=opts, operators=descriptors, poll_s=None) as f, \
            statelog.follow(store_root.url, store_options=opts, operators=descriptors, consistency="flushed",
                            poll_s=None) as fresh:  # fmt: skip
        for _round in range(3):
            w.update(30)
            meta = w.job.checkpoint()
            assert f.poll().checkpoint_id == meta.checkpoint_id
            assert follower_view(f) == w.view()
        w.update(30)
        w.job.flush_soon()
        newer = w.view()
        wait_until(lambda: fresh.poll() and follower_view(fresh) == newer, 30, "the flushed changes applied")
        assert f.position.restores == 1 and fresh.position.restores == 1
    w.close()
