"""One Op enum and one applier per state kind: the codes, the rules, and the restore using them."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.changelog.ops import OVERWRITING_OPS, Op, op_label
from statelog.descriptors import StateInfo, StateKind, TtlConfig
from statelog.errors import CorruptionError
from statelog.restore.appliers import (
    ListApplier,
    MapApplier,
    TimerApplier,
    ValueApplier,
    applier_for,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "format.md"


def test_op_codes_and_labels_are_the_persisted_ones():
    assert {op.label: op.value for op in Op} == {
        "put": 1, "delete": 2, "list_append": 3, "list_replace": 4,
        "map_put": 5, "map_remove": 6, "timer_add": 7, "timer_remove": 8,
    }
    # docs/format.md 4.5 lists the same codes and names
    section = DOCS.read_text().split("### 4.5 Operation codes", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.M)
    assert {name: int(code) for code, name in rows} == {op.label: op.value for op in Op}
    assert op_label(5) == "map_put" and op_label(99) == "99"
    assert {Op.PUT, Op.DELETE, Op.LIST_REPLACE} == OVERWRITING_OPS


def test_each_kind_gets_its_applier():
    def info(kind, name="s", ttl=None):
        return StateInfo(name, kind, pa.int64(), pa.int64() if kind is StateKind.MAP else None, ttl)

    assert type(applier_for(info(StateKind.VALUE))) is ValueApplier
    assert type(applier_for(info(StateKind.REDUCING))) is ValueApplier
    assert type(applier_for(info(StateKind.AGGREGATING))) is ValueApplier
    assert type(applier_for(info(StateKind.LIST))) is ListApplier
    assert type(applier_for(info(StateKind.MAP))) is MapApplier
    assert type(applier_for(info(StateKind.VALUE, "__timers_event"))) is TimerApplier
    assert not applier_for(info(StateKind.LIST)).expiring
    assert applier_for(info(StateKind.LIST, ttl=TtlConfig(1000))).expiring
    assert applier_for(info(StateKind.MAP), expiring=True).expiring


def test_what_each_op_does():
    e: dict = {}
    lst = ListApplier("l")
    lst.apply(e, "k", Op.LIST_APPEND, None, [1, 2], None)
    lst.apply(e, "k", Op.LIST_APPEND, None, [3], None)
    assert e == {"k": [1, 2, 3]}
    lst.apply(e, "k", Op.LIST_REPLACE, None, [9], None)
    assert e == {"k": [9]}
    ListApplier("l", expiring=True).apply(e, "t", Op.LIST_APPEND, None, [1, 2], 50)
    assert e["t"] == [[1, 50], [2, 50]]
    lst.apply(e, "k", Op.DELETE, None, None, None)
    assert "k" not in e
    m: dict = {}
    mp = MapApplier("m", expiring=True)
    mp.apply(m, "k", Op.MAP_PUT, "a", 1, 7)
    mp.apply(m, "k", Op.MAP_PUT, "b", 2, 8)
    mp.apply(m, "k", Op.MAP_REMOVE, "a", None, None)
    assert m == {"k": {"b": [2, 8]}}
    mp.apply(m, "k", Op.MAP_REMOVE, "b", None, None)
    assert m == {}  # an emptied map is no entry
    timers: set = set()
    ta = TimerApplier("__timers_event")
    ta.apply(timers, (5, b"k", b"n"), Op.TIMER_ADD, None, 5, None)
    ta.apply(timers, (6, b"k", b"n"), Op.TIMER_ADD, None, 6, None)
    ta.apply(timers, (5, b"k", b"n"), Op.TIMER_REMOVE, None, 5, None)
    ta.apply(timers, (9, b"k", b"n"), Op.TIMER_REMOVE, None, 9, None)  # absent: no-op
    assert timers == {(6, b"k", b"n")}


@pytest.mark.parametrize(
    ("applier", "op"),
    [(ValueApplier("s"), Op.MAP_PUT), (ListApplier("s"), Op.PUT), (MapApplier("s"), Op.LIST_APPEND),
     (TimerApplier("s"), Op.DELETE), (ValueApplier("s"), 42)],
)
def test_an_op_not_valid_for_the_kind_is_corruption(applier, op):
    with pytest.raises(CorruptionError, match=rf"state 's': operation {op_label(op)} \(code {int(op)}\) is not valid"):
        applier.apply({} if not isinstance(applier, TimerApplier) else set(), "k", op, None, 1, None)
    with pytest.raises(CorruptionError, match="not valid"):
        applier.apply_all([(b"k", b"n", op, None, 1, None)], lambda _n: {} if not isinstance(applier, TimerApplier)
                          else set(), {b"k": "k"})


_records = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"c"]),
        st.sampled_from([b"n1", b"n2"]),
        st.sampled_from([Op.PUT.value, Op.DELETE.value]),
        st.integers(0, 9),
        st.one_of(st.none(), st.integers(0, 100)),
    ),
    max_size=40,
)


@given(_records, st.booleans())
def test_value_applier_inlined_loop_is_apply(recs, expiring):
    """ValueApplier.apply_all (the restore's inlined loop) equals apply() record by record."""
    applier = ValueApplier("v", expiring)
    records = [(kb, nsb, op, None, v if op == Op.PUT else None, exp if op == Op.PUT else None)
               for kb, nsb, op, v, exp in recs]
    keys = {b"a": "A", b"b": "B", b"c": "C"}
    fast: dict = {}
    applier.apply_all(records, lambda nsb: fast.setdefault(nsb, {}), keys)
    ref: dict = {}
    for kb, nsb, op, uk, v, exp in records:
        ValueApplier.apply(applier, ref.setdefault(nsb, {}), keys[kb], op, uk, v, exp)
    assert fast == ref


_puts = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.integers(0, 100), st.one_of(st.none(), st.integers(0, 100))),
    max_size=40,
)


@given(_puts, st.booleans(), st.booleans())
def test_value_applier_bulk_puts_are_apply(puts, expiring, as_iterator):
    """A tail of only puts to one namespace (applied in one bulk update) equals apply()
    record by record: the last put of a key wins, TTL entries are [value, expires]."""
    applier = ValueApplier("v", expiring)
    records = [(kb, b"n", Op.PUT.value, None, v, exp) for kb, v, exp in puts]
    keys = {b"a": "A", b"b": "B", b"c": "C"}
    fast: dict = {"n": {"A": -1}}
    applier.apply_all(iter(records) if as_iterator else records, lambda nsb: fast.setdefault(nsb.decode(), {}), keys)
    ref: dict = {"n": {"A": -1}}
    for kb, nsb, op, uk, v, exp in records:
        ValueApplier.apply(applier, ref.setdefault(nsb.decode(), {}), keys[kb], op, uk, v, exp)
    assert fast == ref


def test_restore_replays_through_the_appliers(tmp_path, monkeypatch):
    """A backend's restore applies its changelog with the state kind's applier."""
    import statelog

    job = statelog.open(tmp_path.as_uri())
    try:
        b = job.backend("op")
        v = b.get_state(ValueStateDescriptor("v", pa.int64()))
        lst = b.get_state(ListStateDescriptor("l", pa.int64()))
        m = b.get_state(MapStateDescriptor("m", pa.int64(), key_type=pa.string()))
        b.set_current_key("k")
        v.update(1)
        lst.add_all([1, 2])
        m.put("x", 3)
        b.timers.register_event_time_timer(10)
        meta = job.checkpoint()
        seen: list[tuple[str, int]] = []
        for cls in (ValueApplier, ListApplier, MapApplier, TimerApplier):
            orig = cls.apply

            def spy(self, entries, key, op, ukey, value, expires, _orig=orig):
                seen.append((self.kind, int(op)))
                return _orig(self, entries, key, op, ukey, value, expires)

            monkeypatch.setattr(cls, "apply", spy)
        # the value applier's inlined loop: seen through apply_all
        orig_all = ValueApplier.apply_all

        def spy_all(self, records, entries_for, keys):
            records = list(records)
            seen.extend((self.kind, r[2]) for r in records)
            return orig_all(self, records, entries_for, keys)

        monkeypatch.setattr(ValueApplier, "apply_all", spy_all)
        r = statelog.open(job.root, writer_lease=False).backend("op", restore=meta, changelog=False)
        r.get_state(ValueStateDescriptor("v", pa.int64()))
        r.get_state(ListStateDescriptor("l", pa.int64()))
        r.get_state(MapStateDescriptor("m", pa.int64(), key_type=pa.string()))
        r.wait_loaded()  # (restored on demand: the records are replayed as key groups load)
        assert sorted(seen) == sorted([("value-like", 1), ("list", 3), ("map", 5), ("timer", 7)])
        r.set_current_key("k")
        assert [t.timestamp for t in r.timers.timers()] == [10]
    finally:
        job.close()


class _Sized(dict):
    """A table that records the size of each bulk update."""

    sizes: list[int]

    def update(self, other=(), **kw):  # type: ignore[override]
        pairs = list(other)
        self.sizes.append(len(pairs))
        super().update(pairs, **kw)


@given(_records, st.booleans())
def test_value_applier_bounds_its_bulk_calls(recs, expiring):
    """A tail longer than BULK_RECORDS is applied in order a bounded call at a time (a call
    into C holds the GIL; one over 10^7 records starved the lease's renewal past its ttl):
    the same result as apply() record by record, no update larger than BULK_RECORDS."""
    import statelog.restore.appliers as appliers

    applier = ValueApplier("v", expiring)
    records = [(kb, b"n", Op.PUT.value, None, v, exp) for kb, _nsb, _op, v, exp in recs]
    records += [(kb, nsb, op, None, v if op == Op.PUT else None, exp if op == Op.PUT else None)
                for kb, nsb, op, v, exp in recs]  # fmt: skip
    keys = {b"a": "A", b"b": "B", b"c": "C"}
    tables: dict = {}

    def table(nsb):
        t = tables.setdefault(nsb, _Sized())
        t.sizes = getattr(t, "sizes", [])
        return t

    saved, appliers.BULK_RECORDS = appliers.BULK_RECORDS, 4
    try:
        applier.apply_all(records, table, keys)
    finally:
        appliers.BULK_RECORDS = saved
    ref: dict = {}
    for kb, nsb, op, uk, v, exp in records:
        ValueApplier.apply(applier, ref.setdefault(nsb, {}), keys[kb], op, uk, v, exp)
    assert {n: dict(t) for n, t in tables.items() if t or n in ref} == ref
    sizes = [size for t in tables.values() for size in t.sizes]
    assert all(size <= 4 for size in sizes)
    # the chunks within the leading puts (one namespace, only puts) went in bulk
    assert sum(sizes) >= 4 * (len(recs) // 4)


def test_a_restore_installs_and_replays_in_bounded_calls(tmp_path, monkeypatch):
    """Base entries, key decoding and the tail's replay, a bounded call at a time: the
    restored state is the written one."""
    import statelog
    import statelog.restore.appliers as appliers
    import statelog.restore.install as install
    from materializer.build import materialize

    job = statelog.open(tmp_path.as_uri())
    try:
        b = job.backend("op")
        v = b.get_state(ValueStateDescriptor("v", pa.int64()))
        for k in range(50):
            b.set_current_key(k)
            v.update(k)
        materialize(job.store, job.checkpoint())
        for k in range(0, 80, 3):  # the tail: overwrites and new keys
            b.set_current_key(k)
            v.update(1000 + k)
        meta = job.checkpoint()
        monkeypatch.setattr(appliers, "BULK_RECORDS", 3)
        monkeypatch.setattr(install, "BULK_RECORDS", 3)
        for on_demand in (False, True):
            r = statelog.open(job.root, writer_lease=False).backend("op", restore=meta, changelog=False, on_demand=on_demand)
            rv = r.get_state(ValueStateDescriptor("v", pa.int64()))
            r.wait_loaded()
            got = {}
            for k in range(80):
                r.set_current_key(k)
                got[k] = rv.value()
            assert got == {k: (1000 + k if k % 3 == 0 else k if k < 50 else None) for k in range(80)}
            assert sorted(k for k, _ns, _v in r.entries("v")) == sorted(k for k in range(80) if k < 50 or k % 3 == 0)
    finally:
        job.close()


@pytest.mark.parametrize("kind", ["ints", "strs", "mixed"])
def test_put_items_equals_dict_update(kind, monkeypatch):
    """A restore's bulk load (``put_items``: in C with the dict's lines prefetched when the
    extension is built) leaves the table as ``dict.update`` does, insertion order included:
    new and existing keys, a table with deleted entries, more keys than one bulk call."""
    import numpy as np

    import statelog.restore.appliers as ap

    monkeypatch.setattr(ap, "BULK_RECORDS", 1000)

    def key(i):
        if kind == "strs" or (kind == "mixed" and i % 3 == 0):
            return f"k{i}"
        return (i, "t") if kind == "mixed" and i % 3 == 1 else i

    rng = np.random.default_rng(7)
    base = {key(i): -i for i in range(0, 20_000, 2)}
    for i in range(0, 20_000, 6):
        del base[key(i)]
    ids = rng.permutation(30_000)[:12_345].tolist()
    keys, values = [key(i) for i in ids], [i * 3 for i in ids]
    got, want = dict(base), dict(base)
    ap.put_items(got, keys, values)
    want.update(zip(keys, values, strict=True))
    assert got == want and list(got) == list(want)
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        ap.put_items({}, [1, 2], [1])


def test_put_items_in_c_refuses_bad_arguments():
    from statelog._ext import load

    fp = load("fastpath")
    if fp is None:
        pytest.skip("statelog/_ext/fastpath.c is not built")
    with pytest.raises(TypeError, match="put_items"):
        fp.put_items({}.items(), [1], [1], 0, 1)
    with pytest.raises(ValueError, match="start and stop"):
        fp.put_items({}, [1], [1], 0, 2)
    with pytest.raises(ValueError, match="1 keys but 2 values"):
        fp.put_items({}, [1], [1, 2], 0, 1)
    table = {}
    with pytest.raises(TypeError, match="unhashable"):
        fp.put_items(table, [1, [2]], [1, 2], 0, 2)
    assert table == {1: 1}  # (as dict.update: the keys before the failure are in)
