"""The disk-backed working set (statelog/state/tables/disk/): the same state as in memory under a
cache far smaller than the state, a local directory that is a cache and never the source of
truth, and clear errors. (The property tests of the core and the materializer and the
runtime's crash loop run with it too: tests/e2e/test_property.py and friends.)"""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import (
    _ext,
)
from statelog.errors import ConfigError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of
from statelog.state.tables.disk import DIR_PREFIX, WorkingSetError, codec
from statelog.state.tables.disk import miss_path as paths
from tests.support.harness import Clock
from tests.support.state_kinds import every_state_kind

DESCRIPTORS = every_state_kind(ttl_ms=50)  # count, seen, attrs, total, avg, blob, TTL states, pmap


def workload(b: Any, clock: Clock, seed: int, n: int = 3000, prefetch: bool = False) -> None:
    """Every state kind, namespaces, clears and TTL expiry over 300 keys; with ``prefetch``,
    every 50 records a prefetch of 64 keys, most of them of the records to come (as a
    consumer loop does with its next batch), with unhashable and other keys among them."""
    states = {d.name: b.get_state(d) for d in DESCRIPTORS}
    count, seen, last, total, avg, ttl = (states[n] for n in ("count", "seen", "attrs", "total", "avg", "ttl_v"))
    rnd = random.Random(seed)
    other = random.Random(seed + 99)
    for i in range(n):
        if prefetch and i % 50 == 0:
            keys: list[Any] = [other.choice([other.randrange(300), f"user-{other.randrange(50)}", (other.randrange(5), "t")])
                               for _ in range(64)]  # fmt: skip
            b.prefetch([*keys, [1, 2], {"x": 1}, 1.0, True])
        key = rnd.choice([rnd.randrange(300), f"user-{rnd.randrange(50)}", (rnd.randrange(5), "t")])
        b.set_current_key(key)
        count.set_namespace(rnd.choice([None, None, (0, 10), (10, 20)]))
        count.update(count.value() + 1)
        seen.add(f"e{i % 7}")
        if i % 11 == 0:
            seen.update(seen.get()[-2:])
        last.put(f"k{i % 4}", i)
        if i % 5 == 0:
            last.remove("k1")
        total.add(rnd.randrange(1000))
        avg.add(rnd.randrange(10))
        if i % 3 == 0:
            ttl.update(i)
        if i % 13 == 0:
            count.clear()
            last.clear()
        clock.now += rnd.randrange(3)


def view(b: Any) -> dict[str, list]:
    for d in DESCRIPTORS:
        b.get_state(d)
    return {d.name: sorted(((repr(k), repr(ns), repr(v)) for k, ns, v in b.entries(d.name))) for d in DESCRIPTORS}


def open_job(root: Path, store: str, state_dir: Path, **kw: Any) -> statelog.StateJob:
    job = statelog.open(root.as_uri(), max_parallelism=16, state_store=store, state_dir=str(state_dir), **kw)
    job.state_cache_entries = 8  # far fewer than the ~1500 entries: most reads go to disk
    return job


@pytest.fixture(params=["c", "python"])
def miss_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The working set's miss path in C (statelog/_ext/workingset.c) and its pure-Python reference."""
    if request.param == "python":
        for name in ("key_prefix", "admit", "write_back", "plan", "install_many", "clock_victims"):
            monkeypatch.setattr(paths, name, getattr(paths, name + "_py"))
        monkeypatch.setattr(codec, "dumps", codec.rec_dumps_py)
        monkeypatch.setattr(codec, "loads", codec.rec_loads_py)
    elif not _ext.FORCE_PYTHON:
        assert paths.C is not None, "statelog/_ext/workingset.c is not built (make venv builds it)"
    return request.param


@pytest.mark.parametrize("on_demand", [False, True], ids=["eager", "on-demand"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["", "prefetch"])
def test_same_state_and_restore_as_in_memory_under_a_tiny_cache(
    tmp_path: Path, on_demand: bool, miss_path: str, prefetch: bool
) -> None:
    views = {}
    for store in ("memory", "disk"):
        clock = Clock()
        job = open_job(tmp_path / store, store, tmp_path / "ws")
        b = job.backend("op", clock=clock)
        workload(b, clock, seed=7, prefetch=prefetch)
        if store == "disk":
            ws = b._ws
            assert ws.cached <= 8 and ws.misses > 1000 and ws.written_back > 1000, ws.stats()
            assert (ws.prefetched > 1000) == prefetch, ws.stats()
        before = view(b)
        job.checkpoint(sources={"s": 1})
        job.close()
        job = open_job(tmp_path / store, store, tmp_path / "ws", on_demand_restore=on_demand)
        b = job.backend("op", restore="latest", clock=clock)
        after = view(b)
        workload(b, clock, seed=8, n=500, prefetch=prefetch)  # and it goes on from the restored state
        views[store] = (before, after, view(b))
        job.close()
        assert before == after
    assert views["memory"] == views["disk"]
    assert sum(len(v) for v in views["disk"][0].values()) > 1000


def test_a_prefetched_keys_first_record_is_its_admission_not_a_second_use(tmp_path: Path) -> None:
    """CLOCK spares resident keys set current again since they were admitted. A prefetched
    key's first record finds it resident (a hit, which marks it), but that record is the one
    it was read for: the next prefetch unmarks it, so that an eviction takes keys used once
    before a key used twice (else every prefetched key looks used twice and the eviction
    degrades to first in, first out)."""
    job = statelog.open((tmp_path / "r").as_uri(), max_parallelism=16, state_store="disk", state_dir=str(tmp_path / "ws"))
    job.state_cache_entries = 20
    b = job.backend("op")
    count = b.get_state(DESCRIPTORS[0])
    ws = b._ws

    def batch(keys: list[int]) -> None:
        b.prefetch(keys)
        for k in keys:
            b.set_current_key(k)
            count.update(count.value() + 1)

    batch(list(range(10)))
    batch([*range(10, 20), 3])  # 3 used again
    assert ws.touched == {*range(10, 20), 3}  # 0-9 unmarked: their one use was their admission
    batch(list(range(20, 30)))  # 10 resident keys evicted to make room
    assert 3 in ws.resident and not {0, 1, 2, 4, 5} & set(ws.resident)
    for k in range(30):
        b.set_current_key(k)
        assert count.value() == 1 + (k == 3)
    job.close()


def test_prefetched_keys_are_resident_and_read_in_one_batch(tmp_path: Path) -> None:
    """prefetch() reads the records of the keys not resident in one multi-get, so the records
    that follow find their keys resident; it skips keys of other subtasks, unhashable and
    unencodable keys, and does nothing on the in-memory store or while restoring on demand."""
    job = statelog.open((tmp_path / "r").as_uri(), max_parallelism=16, state_store="disk", state_dir=str(tmp_path / "ws"))
    b = job.backend("op", subtask=0, parallelism=2)
    job.backend("op", subtask=1, parallelism=2).get_state(DESCRIPTORS[0])
    count = b.get_state(DESCRIPTORS[0])
    mine = [k for k in range(400) if statelog.key_group_of(k, 16) <= b.key_groups.end][:200]
    theirs = [k for k in range(400) if statelog.key_group_of(k, 16) > b.key_groups.end][:5]
    for k in mine:
        b.set_current_key(k)
        count.update(k)
    ws = b._ws
    ws.release()  # every key written back: none resident
    gets: list[int] = []
    ws._db = _Spy(ws._db, gets)
    assert b.prefetch([*mine[:50], *mine[:10], *theirs, [1], object()]) == 50
    assert gets == [50] and all(k in ws.resident for k in mine[:50]) and ws.prefetched == 50
    misses = ws.misses
    for k in mine[:50]:
        b.set_current_key(k)
        assert count.value() == k
    assert ws.misses == misses and gets == [50]  # all resident: no read
    assert b.prefetch(mine[:50]) == 0 and gets == [50]
    ws._db = _Spy.unwrap(ws._db)
    cid = job.checkpoint().checkpoint_id
    job.close()
    job = statelog.open((tmp_path / "r").as_uri(), max_parallelism=16, state_store="disk",
                        state_dir=str(tmp_path / "ws"), on_demand_restore=True)  # fmt: skip
    job.on_demand_background = False
    b = job.backend("op", subtask=0, parallelism=2, restore=cid)
    count = b.get_state(DESCRIPTORS[0])
    assert b.loading and b.prefetch(mine[:20]) == 0  # the key groups load first
    b.wait_loaded()  # (the tail's keys are resident after its replay)
    b._ws.release()
    assert b.prefetch(mine[:20]) == 20
    b.set_current_key(mine[5])
    assert count.value() == mine[5]
    job.close()
    with statelog.open((tmp_path / "m").as_uri(), max_parallelism=16) as mem:
        assert mem.backend("op").prefetch(range(10)) == 0


class _Spy:
    """The database, with the sizes of its batched reads recorded."""

    def __init__(self, db: Any, gets: list[int]) -> None:
        self._db, self._gets = db, gets

    def get(self, key: Any) -> Any:
        if isinstance(key, list):
            self._gets.append(len(key))
        return self._db.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    @staticmethod
    def unwrap(spy: Any) -> Any:
        return spy._db


@pytest.mark.skipif(paths.C is None, reason="statelog/_ext/workingset.c not built or STATELOG_PURE_PYTHON set")
@pytest.mark.parametrize("seed", range(40))
def test_the_c_miss_path_equals_its_python_reference(seed: int) -> None:
    """install, admit and write_back in C and in Python, on the same random resident keys (entries of
    registered states, of unregistered ones, none at all; records in the database or not),
    leave the same dicts, sets and database operations (in database-key order), dropping the
    keys or not."""
    rnd = random.Random(seed)
    sids = [1, 3, 4][: rnd.randrange(0, 4)]
    keys = [rnd.choice([i, f"k{i}", (i, "t")]) for i in range(rnd.randrange(1, 30))]

    def build() -> tuple[dict, list, dict, set]:
        r = random.Random(seed + 1000)
        res = {k: (type(k), encode_key(k), r.randrange(16)) for k in keys}
        primary: list[dict] = [{} for _ in sids]
        extra: dict = {}
        present = set()
        for k in keys:
            for t in primary:
                if r.random() < 0.6:
                    t[k] = r.choice([r.randrange(9), [1, 2], {"a": r.randrange(5)}])
            if r.random() < 0.3:
                extra[k] = {9: r.randrange(5)}
            if r.random() < 0.5:
                present.add(k)
        return res, primary, extra, present

    for drop in (True, False):
        out = []
        chosen = [k for k in keys if rnd.random() < 0.7]
        for impl in (paths.C.write_back, paths.write_back_py):
            res, primary, extra, present = build()
            ops: list = []
            n = impl(chosen, res, drop, primary, list(sids), extra, present,
                     lambda k, v, ops=ops: ops.append(("put", k, v)), lambda k, ops=ops: ops.append(("delete", k)),
                     pickle.dumps, pickle.HIGHEST_PROTOCOL)  # fmt: skip
            out.append((n, ops, res, primary, extra, present))
        assert out[0] == out[1]
        assert out[0][0] == len(out[0][1])
        written = [op[1] for op in out[0][1]]
        assert written == sorted(written)  # in database-key order (the memtable inserts it faster)
    for _ in range(5):
        rec = {sid: rnd.randrange(100) for sid in rnd.sample([1, 2, 3, 4, 9], rnd.randrange(0, 5))}
        index = {sid: i for i, sid in enumerate(sids)}
        done = []
        had_extra = rnd.random() < 0.5
        for impl in (paths.C.install, paths.install_py):
            primary = [{"other": 1} for _ in sids]
            extra: dict = {"k": {7: 0}} if had_extra else {}
            impl("k", dict(rec), index, primary, extra)
            done.append((primary, extra))
        assert done[0] == done[1]
    db = {paths.key_prefix_py(kg, encode_key(k)): pickle.dumps({sid: k for sid in [*sids, 9]}) for k, kg in [(1, 3), ("x", 5)]}
    for key, kg in [(1, 3), ("x", 5), (2, 3)]:  # two with a record, one without
        info = (type(key), encode_key(key), kg)
        done = []
        for impl in (paths.C.admit, paths.admit_py):
            present: set = set()
            primary = [{} for _ in sids]
            extra: dict = {}
            res: dict = {}
            found = impl(key, info, db.get, pickle.loads, present, {sid: i for i, sid in enumerate(sids)}, primary, extra, res)
            done.append((found, present, primary, extra, res))
        assert done[0] == done[1]
        assert done[0][0] is (key != 2) and done[0][4] == {key: info}


@pytest.mark.skipif(paths.C is None, reason="statelog/_ext/workingset.c not built or STATELOG_PURE_PYTHON set")
@pytest.mark.parametrize("seed", range(40))
def test_the_c_prefetch_and_eviction_paths_equal_their_python_references(seed: int) -> None:
    """plan, install_many and clock_victims in C and in Python, on the same random inputs: keys of
    every kind (exact ints, negative and beyond int64, bools, floats, ASCII and other strs,
    long strs, tuples, unhashable and unencodable keys), resident or not, repeated, in and
    out of the key-group range; records present or not; touched and current keys."""
    rnd = random.Random(seed)

    class Odd:  # hashable, but encode_key refuses it
        pass

    pool: list = [
        *range(-3, 40), 2**63, -(2**63) - 1, True, False, 1.0, 2.5, "a", "ü", "x" * 127, "y" * 128, "z" * 300,
        (1, "t"), None, b"b", [1], {"a": 1}, Odd(),
    ]
    keys = [rnd.choice(pool) for _ in range(rnd.randrange(0, 60))]
    resident = {k: (type(k), encode_key(k), 0) for k in rnd.sample(range(-3, 40), rnd.randrange(0, 20))}
    lo = rnd.randrange(0, 16)
    hi = rnd.randrange(lo, 16)
    plans = [impl(iter(keys), resident, lo, hi, 16, encode_key) for impl in (paths.C.plan, paths.plan_py)]
    assert plans[0] == plans[1]
    todo, infos, prefixes = (list(x) for x in plans[0])
    assert all(lo <= info[2] <= hi and info[0] is type(k) for k, info in zip(todo, infos, strict=True))
    sids = [1, 3][: rnd.randrange(0, 3)]
    raws = [None if rnd.random() < 0.3 else pickle.dumps({sid: i for sid in [*sids, 9]}) for i in range(len(todo))]
    done = []
    for impl in (paths.C.install_many, paths.install_many_py):
        present: set = set()
        primary = [{} for _ in sids]
        extra: dict = {}
        res = dict(resident)
        impl(todo, infos, raws, pickle.loads, present, {sid: i for i, sid in enumerate(sids)}, primary, extra, res)
        done.append((present, primary, extra, list(res.items())))
    assert done[0] == done[1]
    assert len(done[0][3]) == len(resident) + len(todo)
    order = list(range(rnd.randrange(1, 80)))
    rnd.shuffle(order)
    touched_init = {k for k in order if rnd.random() < rnd.choice([0.1, 0.5, 0.95])}
    n = rnd.randrange(1, len(order) + 2)
    missing = object()
    cur = rnd.choice([missing, rnd.choice(order), 10**6])
    out = []
    for impl in (paths.C.clock_victims, paths.clock_victims_py):
        res = {k: k for k in order}
        touched = set(touched_init)
        victims = impl(res, n, touched, cur, missing)
        out.append((victims, list(res), touched))
    assert out[0] == out[1]
    assert cur not in out[0][0] and len(out[0][0]) == min(n, len(order) - (cur in order))


def _plain_value(rnd: random.Random, depth: int = 0) -> Any:
    """A random value of the record codec's plain types (nested lists, tuples and dicts)."""
    kinds = ["none", "bool", "int", "float", "str", "bytes"] + (["list", "tuple", "dict"] * 2 if depth < 4 else [])
    k = rnd.choice(kinds)
    if k == "none":
        return None
    if k == "bool":
        return rnd.random() < 0.5
    if k == "int":
        return rnd.choice([0, 1, -1, 63, 64, -64, -65, 2**63 - 1, -(2**63), rnd.randrange(-(2**63), 2**63),
                           rnd.randrange(-300, 300)])  # fmt: skip
    if k == "float":
        return rnd.choice([0.0, -0.0, 1.5, -2.25e300, float("inf"), float("-inf"), float("nan"), rnd.random()])
    if k == "str":
        return rnd.choice(["", "a", "abc" * rnd.randrange(0, 60), "ü€", "日本語" * rnd.randrange(1, 4), "\x00\x7f"])
    if k == "bytes":
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 200)))
    items = [_plain_value(rnd, depth + 1) for _ in range(rnd.randrange(0, 6))]
    if k == "list":
        return items
    if k == "tuple":
        return tuple(items)
    return {rnd.choice([rnd.randrange(-5, 5), f"k{rnd.randrange(9)}", (1, "t"), b"b", None, 2.5]): v for v in items}


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (1, 1.0 and True differ; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and str(a) == str(b) or (a != a and b != b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(k, j) for k, j in zip(a, b, strict=True)) and all(
            _same(a[k], b[k]) for k in a)
    return a == b


class _IntSub(int):
    """Not an exact int: the plain form leaves it to pickle."""


def _outcome(f: Any, raw: bytes) -> tuple:
    try:
        return ("ok", repr(f(raw)))
    except Exception as e:  # noqa: BLE001 - a changed first byte may make it a (broken) pickle
        return ("error", type(e).__name__)


@pytest.mark.skipif(codec.C is None, reason="statelog/_ext/workingset.c not built or STATELOG_PURE_PYTHON set")
@pytest.mark.parametrize("seed", range(40))
def test_the_c_record_codec_equals_its_python_reference(seed: int) -> None:
    """rec_dumps and rec_loads in C and in Python (docs/format.md section 10): the same bytes for
    the same value; each reads the other's bytes back to the same value with the same types;
    values outside the plain form (ints beyond int64, lone surrogates, sets, subclasses,
    nesting deeper than 32) are pickles; and bytes that do not parse (every truncation, random
    changes) raise in both alike."""
    rnd = random.Random(seed)
    values = [_plain_value(rnd) for _ in range(20)]
    deep: Any = 1
    for _ in range(33):
        deep = [deep]
    odd = [2**63, -(2**63) - 1, "\ud800", {1, 2}, _IntSub(3), deep, {"a": [1, frozenset()]}, (1, 2.5, 10**30)]
    for v in values + odd:
        raws = [f(v, pickle.HIGHEST_PROTOCOL) for f in (codec.C.rec_dumps, codec.rec_dumps_py)]
        assert raws[0] == raws[1]
        raw = raws[0]
        assert raw[0] == (0x80 if any(v is o for o in odd) else 0x01)
        for f in (codec.C.rec_loads, codec.rec_loads_py):
            assert _same(f(raw), v) if raw[0] == 0x01 else f(raw) == v
        if raw[0] == 0x01:
            for cut in range(1, len(raw)):  # every truncation: a clear error in both
                for f in (codec.C.rec_loads, codec.rec_loads_py):
                    with pytest.raises(ValueError, match="does not parse"):
                        f(raw[:cut])
            for _ in range(30):  # a changed byte: both read the same value or both refuse it
                b = bytearray(raw)
                b[rnd.randrange(len(b))] = rnd.randrange(256)
                assert _outcome(codec.C.rec_loads, bytes(b)) == _outcome(codec.rec_loads_py, bytes(b))
    for f in (codec.C.rec_loads, codec.rec_loads_py):
        for bad in (b"", b"\x02abc", b"\x01", b"\x01\x00\x00", b"\x01\x0a"):
            with pytest.raises(ValueError, match="does not parse"):
                f(bad)
    for f in (codec.C.rec_dumps, codec.rec_dumps_py):
        with pytest.raises(ValueError, match="protocol"):
            f({1, 2}, 1)


def test_records_of_plain_values_are_stored_in_the_plain_form(tmp_path: Path, miss_path: str) -> None:
    """A key's record of plain values is written in the plain form, one of other values as a
    pickle, and both read back (format.md section 10)."""
    import decimal

    job = open_job(tmp_path / "root", "disk", tmp_path / "ws")
    b = job.backend("op", changelog=False)
    v = b.get_state(statelog.ValueStateDescriptor("v", pa.int64()))
    m = b.get_state(statelog.MapStateDescriptor("m", key_type=pa.string(), value_type=pa.int64()))
    for k in range(40):
        b.set_current_key(k)
        v.update(k * 7 - 100)
        m.put_all({"a": k, "ü": -k})
    ws = b._ws
    ws.release()
    raw = ws.get(paths.key_prefix_py(ws.key_info(3)[2], encode_key(3)))
    assert raw is not None and raw[0] == codec.REC_MAGIC
    rec = codec.loads(raw)
    assert sorted(rec.values(), key=repr) == sorted([-79, {"a": 3, "ü": -3}], key=repr)
    for k in range(40):
        b.set_current_key(k)
        assert v.value() == k * 7 - 100 and dict(m.items()) == {"a": k, "ü": -k}
    w = b.get_state(statelog.ValueStateDescriptor("w", pa.decimal128(10, 2)))
    b.set_current_key(5)
    w.update(decimal.Decimal("1.25"))
    ws.release()
    raw = ws.get(paths.key_prefix_py(ws.key_info(5)[2], encode_key(5)))
    assert raw is not None and raw[0] == 0x80  # a Decimal: a pickle
    b.set_current_key(5)
    assert w.value() == decimal.Decimal("1.25") and v.value() == -65
    job.close()


def test_states_registered_late_keep_their_restored_entries(tmp_path: Path) -> None:
    """A key's record holds the entries of every state: keys made resident and evicted while
    some restored states are not registered yet keep those states' entries, and a state
    registered while a key is current sees that key's entry at once."""
    clock = Clock()
    job = open_job(tmp_path / "root", "disk", tmp_path / "ws")
    b = job.backend("op", clock=clock)
    workload(b, clock, seed=3, n=2000)
    want = view(b)
    job.checkpoint(sources={})
    job.close()
    job = open_job(tmp_path / "root", "disk", tmp_path / "ws")
    b = job.backend("op", restore="latest", clock=clock)
    count = b.get_state(DESCRIPTORS[0])
    keys = {k for k, _ns, _v in count.entries()}
    for k in sorted(keys, key=repr):  # resident, then evicted (8 at most): records written back
        b.set_current_key(k)
        count.value()
    assert b._ws.evictions > 10, b._ws.stats()
    b.set_current_key(next(iter(keys)))
    last = b.get_state(DESCRIPTORS[2])  # registered while a key is current
    stored = {k: v for k, ns, v in want["attrs"] if ns == repr(None)}
    assert repr(dict(last.items())) == stored.get(repr(b.current_key), "{}")
    assert view(b) == want
    job.close()


def test_the_directory_is_a_cache_deleted_at_close_and_never_uploaded(tmp_path: Path) -> None:
    ws_dir = tmp_path / "ws"
    job = open_job(tmp_path / "root", "disk", ws_dir)
    b = job.backend("op")
    workload(b, Clock(), seed=1, n=500)
    (d,) = list(ws_dir.iterdir())
    assert d.name.startswith(f"{DIR_PREFIX}{os.getpid()}-op-0-") and any(d.iterdir())
    job.checkpoint(sources={})
    uploaded = [i.key for i in job.store.list()]
    assert uploaded and not [k for k in uploaded if DIR_PREFIX in k or k.endswith((".sst", ".log"))]
    job.close()
    assert list(ws_dir.iterdir()) == []


def test_a_killed_process_leaves_its_directory_to_the_next_one(tmp_path: Path) -> None:
    """A process killed while holding a working set leaves the directory; the next backend
    under the same state_dir deletes it (it is never reused) and restores from the checkpoint."""
    ws_dir = tmp_path / "ws"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).parents[3])!r})
from tests.statelog.state.test_disk import Clock, open_job, workload
from pathlib import Path
job = open_job(Path({str(tmp_path / 'root')!r}), "disk", Path({str(ws_dir)!r}))
b = job.backend("op", clock=Clock())
workload(b, Clock(), seed=3, n=800)
job.checkpoint(sources={{"s": 9}})
workload(b, Clock(), seed=4, n=200)  # after the checkpoint: lost with the process
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (stale,) = list(ws_dir.iterdir())
    assert stale.name.startswith(DIR_PREFIX) and any(stale.iterdir())
    # the expected state: the same operations up to the checkpoint, in memory
    mem = open_job(tmp_path / "mem", "memory", ws_dir)
    mb = mem.backend("op", clock=Clock())
    workload(mb, Clock(), seed=3, n=800)
    want = view(mb)
    mem.close()
    job = open_job(tmp_path / "root", "disk", ws_dir)
    b = job.backend("op", restore="latest", clock=Clock())
    assert not stale.exists()
    assert job.latest_checkpoint().sources == {"s": 9}
    assert view(b) == want
    job.close()


def test_a_corrupt_local_file_fails_clearly_and_the_checkpoint_rebuilds_it(tmp_path: Path) -> None:
    ws_dir = tmp_path / "ws"
    clock = Clock()
    job = open_job(tmp_path / "root", "disk", ws_dir)
    b = job.backend("op", clock=clock)
    workload(b, clock, seed=5, n=2000)
    want = view(b)
    job.checkpoint(sources={})
    ws = b._ws
    ws.flush()
    ws._db.flush()  # everything in table files
    ws._db.compact_range(None, None)
    ws.evict()
    while ws.cached:
        ws.evict()
    ssts = list(Path(ws.path).glob("*.sst"))
    assert ssts
    for sst in ssts:  # flip bytes in the middle of every table file
        data = bytearray(sst.read_bytes())
        for i in range(len(data) // 4, len(data) // 2, 97):
            data[i] ^= 0xFF
        sst.write_bytes(bytes(data))
    with pytest.raises(WorkingSetError, match="restart the job from its latest checkpoint"):
        view(b)
    job.close(flush=False)
    job = open_job(tmp_path / "root", "disk", ws_dir)
    b = job.backend("op", restore="latest", clock=clock)
    assert view(b) == want
    job.close()


@pytest.mark.parametrize("how", ["set_current_key", "prefetch"])
def test_a_value_that_does_not_parse_fails_the_task_clearly(tmp_path: Path, miss_path: str, how: str) -> None:
    """A record whose bytes do not parse (format.md section 10) fails the task with
    WorkingSetError, which says to restart from the checkpoint, when it is read."""
    job = open_job(tmp_path / "root", "disk", tmp_path / "ws")
    b = job.backend("op", changelog=False)
    v = b.get_state(statelog.ValueStateDescriptor("v", pa.int64()))
    for k in range(20):
        b.set_current_key(k)
        v.update(k)
    ws = b._ws
    ws.release()
    ws._db.put(paths.key_prefix_py(ws.key_info(7)[2], encode_key(7)), bytes([codec.REC_MAGIC, 9, 0x7F]))
    b.set_current_key(6)
    assert v.value() == 6
    with pytest.raises(WorkingSetError, match="does not parse.*restart the job from its latest checkpoint"):
        if how == "prefetch":
            b.prefetch([5, 7])
        else:
            b.set_current_key(7)
    job.close(flush=False)


def test_drop_key_groups_removes_cached_and_stored_entries(tmp_path: Path) -> None:
    job = open_job(tmp_path / "root", "disk", tmp_path / "ws")
    b = job.backend("op")
    count = b.get_state(DESCRIPTORS[0])
    for k in range(400):
        b.set_current_key(k)
        count.update(k)
    groups = {k: key_group_of(k, 16) for k in range(400)}
    b._ws.drop_key_groups(0, 7)
    left = {k for k, _ns, _v in count.entries()}
    assert left == {k for k, g in groups.items() if g > 7} and 0 < len(left) < 400
    job.close()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"state_store": "ssd"}, "state_store must be 'memory' .* or 'disk'"),
        ({"state_store": "disk", "state_memory": "lots"}, "state_memory: invalid size 'lots'"),
        ({"state_store": "disk", "state_memory": "1KB"}, r"state_memory must be in \[1MB, 16TB\], got 1024 bytes"),
        ({"state_store": "disk", "state_dir": 7}, "state_dir must be a local directory path"),
    ],
)
def test_bad_options_are_refused_clearly(tmp_path: Path, kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        statelog.open(tmp_path.as_uri(), **kw)


def test_runtime_refuses_a_bad_state_store(tmp_path: Path) -> None:
    from runtime import StreamExecutionEnvironment

    with pytest.raises(ConfigError, match="state_store must be"):
        StreamExecutionEnvironment(state_root=tmp_path.as_uri(), state_store="ram")


def test_a_state_dump_of_a_disk_store_is_refused(tmp_path: Path) -> None:
    """The state-dump baseline copies the in-memory tables, which hold only resident keys."""
    from bench.baselines.state_dump import encode_state_dump
    from bench.baselines.state_dump_backend import StateDumpBackend
    from runtime import StreamExecutionEnvironment
    from runtime.errors import JobGraphError
    from statelog.errors import StatelogError

    with pytest.raises(JobGraphError, match="use state_store='memory' with it"):
        StreamExecutionEnvironment(state_root=tmp_path.as_uri(), state_store="disk", state_backend=StateDumpBackend())
    job = open_job(tmp_path / "root", "disk", tmp_path / "ws")
    b = job.backend("op", changelog=False)
    b.get_state(DESCRIPTORS[0])
    with pytest.raises(StatelogError, match="state_store='disk' keeps its state on local disk"):
        encode_state_dump(b)
    job.close()


def test_an_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    job = statelog.open(tmp_path.joinpath("root").as_uri(), state_store="disk", state_dir=str(blocker / "sub"))
    with pytest.raises(ConfigError, match="state_dir .* cannot be created"):
        job.backend("op")
    job.close()
