"""What a follower's poll costs while it keeps up: a poll without a newer checkpoint reads no
metadata; catching up reads only the segments after what it applied, each once; "flushed"
finds new segments by name (no listing) and reads a footer once; a block of puts to one
namespace is applied in bulk with the same result as record by record. (Followers restore at
once here: an on-demand restore reads in the background, beside the polls counted.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import TtlConfig, ValueStateDescriptor
from statelog.state.keyed import KeyedState
from tests.support.s3server import RootSpec
from tests.support.wait import wait_until

UID = "op"
VALUE = ValueStateDescriptor("v", pa.int64(), default=0)
TTL_VALUE = ValueStateDescriptor("t", pa.int64(), TtlConfig(10**9))


class StoreCalls:
    """Counts the calls (and bytes got) of the follower's store: the real store, observed."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        self.segment_bytes = 0  # got of changelog segments
        for name in ("get", "get_range", "head", "list"):
            monkeypatch.setattr(store, name, self._wrap(name, getattr(store, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(key: str = "", *args: Any) -> Any:
            self.calls.append((name, key))
            out = fn(key, *args)
            if name in ("get", "get_range") and key.startswith("changelog/"):
                self.segment_bytes += len(out)
            return out

        return call

    def reset(self) -> None:
        self.calls.clear()
        self.segment_bytes = 0


def _writer(root: RootSpec) -> tuple[Any, Any, dict[str, Any]]:
    job = statelog.open(root.url, store_options=root.options, max_parallelism=16)
    b = job.backend(UID, restore="none")
    return job, b, {d.name: b.get_state(d) for d in (VALUE, TTL_VALUE)}


def _update(b: Any, states: dict[str, Any], keys: range, n: int) -> None:
    for k in keys:
        b.set_current_key(k)
        for st in states.values():
            st.update(k * 1000 + n)


def test_a_poll_without_a_newer_checkpoint_reads_no_metadata(file_root: RootSpec, monkeypatch) -> None:
    job, b, states = _writer(file_root)
    _update(b, states, range(20), 0)
    job.checkpoint()
    with statelog.follow(file_root.url, poll_s=None, on_demand=False) as f:
        calls = StoreCalls(f._store, monkeypatch)
        f.poll()
        assert [c for c in calls.calls if c[0] != "list"] == []  # one listing of checkpoint keys only
        _update(b, states, range(20), 1)
        meta = job.checkpoint()
        assert f.poll().checkpoint_id == meta.checkpoint_id
        assert any(op == "get" and key.startswith("checkpoints/") for op, key in calls.calls)
    job.close()


def test_catching_up_reads_only_the_segments_after_what_it_applied(file_root: RootSpec, monkeypatch) -> None:
    """Without a materialization every checkpoint lists every segment since the first; a
    follower that keeps up reads only the new ones."""
    job, b, states = _writer(file_root)
    _update(b, states, range(200), 0)
    job.checkpoint()
    with statelog.follow(file_root.url, poll_s=None, on_demand=False) as f:
        calls = StoreCalls(f._store, monkeypatch)
        for n in range(1, 7):
            applied = dict(f._replicas[UID].applied)
            _update(b, states, range(200), n)
            meta = job.checkpoint()
            calls.reset()
            assert f.poll().checkpoint_id == meta.checkpoint_id
            segments = {s.name: s for h in meta.operators[UID].subtasks for r in h.changelog for s in r.segments}
            new = {s.name for h in meta.operators[UID].subtasks for r in h.changelog for s in r.segments
                   if s.end > applied.get(r.stream, 0)}  # fmt: skip
            got = {key for op, key in calls.calls if op in ("get", "get_range") and key.startswith("changelog/")}
            assert got == new and len(segments) > len(new)
            assert calls.segment_bytes == sum(segments[s].size for s in new)  # each read once, whole
        _update(b, states, range(200), 99)
        b.set_current_key(7)
        want = {d.name: (states[d.name].value()) for d in (VALUE, TTL_VALUE)}
        job.checkpoint()
        f.poll()
        assert {name: f.get(UID, name, 7) for name in want} == want
        assert f.position.restores == 1
    job.close()


def test_flushed_finds_new_segments_by_name_and_reads_each_footer_once(file_root: RootSpec, monkeypatch) -> None:
    job, b, states = _writer(file_root)
    _update(b, states, range(50), 0)
    job.checkpoint()
    with statelog.follow(file_root.url, consistency="flushed", poll_s=None, on_demand=False) as f:
        calls = StoreCalls(f._store, monkeypatch)
        for n in range(1, 4):
            _update(b, states, range(50), n)
            job.flush_soon()
            wait_until(lambda n=n: f.poll() and f.get(UID, "v", 49) == 49_000 + n, 30, f"flushed round {n} applied")
        assert not [c for c in calls.calls if c[0] == "list" and c[1].startswith("changelog/")]
        got = [key for op, key in calls.calls if op == "get" and key.startswith("changelog/")]
        assert got and len(got) == len(set(got))  # each new segment read once (footer and blocks)
        calls.reset()
        f.poll()  # nothing new: one name asked for per writer, nothing read
        assert [c for c in calls.calls if c[1].startswith("changelog/") and c[0] != "head"] == []
        assert len([c for c in calls.calls if c[0] == "head"]) == 1
    job.close()


@pytest.mark.parametrize("state_store", ["memory", "disk"])
def test_puts_to_one_namespace_are_applied_in_bulk_as_record_by_record(
    file_root: RootSpec, monkeypatch, state_store: str, tmp_path
) -> None:
    """A block of puts only, to one namespace, of a value state and a value state with TTL,
    then a block with deletes: the follower's state is the writer's (the bulk path used)."""
    job, b, states = _writer(file_root)
    _update(b, states, range(100), 0)
    job.checkpoint()
    bulk: list[int] = []
    replay_puts = KeyedState.replay_puts

    def counted(self: Any, nsb: bytes, keys: list[Any], values: list[Any], expires: list[Any]) -> None:
        bulk.append(len(keys))
        replay_puts(self, nsb, keys, values, expires)

    monkeypatch.setattr(KeyedState, "replay_puts", counted)
    with statelog.follow(file_root.url, operators={UID: [VALUE, TTL_VALUE]}, poll_s=None, state_store=state_store,
                         state_dir=str(tmp_path / "follower")) as f:  # fmt: skip
        _update(b, states, range(0, 100, 3), 1)  # puts only
        job.checkpoint()
        f.poll()
        assert bulk
        for k in range(0, 100, 2):  # puts and deletes
            b.set_current_key(k)
            states["v"].clear() if k % 4 else states["t"].update(-k)
        job.checkpoint()
        f.poll()
        for k in range(100):
            b.set_current_key(k)
            assert (f.get(UID, "v", k), f.get(UID, "t", k)) == (states["v"].value(), states["t"].value()), k
    job.close()
