"""The Arrow merge of value-like states and timers in materializations (``merge_last_wins``) gives
what the reference appliers (statelog/restore/appliers.py) give on random op sequences."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statelog.changelog.format import block_schema
from statelog.changelog.ops import Op
from statelog.descriptors import StateInfo, StateKind, TtlConfig
from statelog.errors import CorruptionError
from statelog.materialization.table_merge import merge_last_wins, merge_python
from statelog.materialization.table_schema import image_to_table, table_to_image
from statelog.restore.appliers import applier_for

KEYS = [b"\x06\x01a", b"\x06\x01b", b"\x06\x01c", b"\x06\x01d"]
NSS = [b"\x00", b"\x03\x80\x00\x00\x00\x00\x00\x00\x05"]
VALUE = StateInfo("v", StateKind.VALUE, pa.int64(), None, None)
VALUE_TTL = StateInfo("vt", StateKind.VALUE, pa.int64(), None, TtlConfig(1000))
TIMERS = StateInfo("__timers_event", StateKind.VALUE, pa.int64(), None, None)


def _kg(kb: bytes) -> int:
    return kb[-1] % 3  # a key always has the same key group


def _tail(info: StateInfo, recs: list[tuple]) -> list[pa.Table]:
    """Change records ``(key, namespace, op, value, expires)`` as a changelog block table (none
    without records, as the materializer passes them)."""
    if not recs:
        return []
    schema = block_schema(info.value_type, None, False)
    kb, nsb, op, value, exp = zip(*recs, strict=True)
    return [pa.table(
        [pa.array(range(len(recs)), pa.int64()), pa.array([_kg(k) for k in kb], pa.uint16()),
         pa.array(op, pa.uint8()), pa.array(kb, pa.binary()), pa.array(nsb, pa.binary()),
         pa.nulls(len(recs)), pa.array(value, pa.int64()), pa.array(exp, pa.int64())],
        schema=schema,
    )]


def _reference(info: StateInfo, base: pa.Table, recs: list[tuple]) -> list[dict]:
    """The image after the reference applier applied every record to the base's entries."""
    applier = applier_for(info, expiring=True)
    timers = info.name.startswith("__timers")
    img: dict | set = set() if timers else {}
    for k, e in table_to_image(info, base):
        if timers:
            img.add(k)
        else:
            img[k] = e
    for kb, nsb, op, v, exp in recs:
        key = (_kg(kb), kb, nsb, v) if timers else (_kg(kb), kb, nsb)
        applier.apply(img, key, op, None, v, exp)
    rows = [(k, None) for k in sorted(img)] if timers else sorted(img.items())
    return image_to_table(info, rows).to_pylist()


_key = st.sampled_from(KEYS)
_ns = st.sampled_from(NSS)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([VALUE, VALUE_TTL]),
    st.dictionaries(st.tuples(_key, _ns), st.tuples(st.integers(-5, 5), st.integers(0, 9)), max_size=6),
    st.lists(st.tuples(_key, _ns, st.sampled_from([Op.PUT, Op.DELETE]), st.integers(-5, 5), st.integers(0, 9)),
             max_size=30),
)
def test_value_merge_equals_the_value_applier(info, base_entries, ops):
    ttl = info.ttl is not None
    base = image_to_table(info, sorted(((_kg(kb), kb, nsb), (v, x if ttl else None))
                                       for (kb, nsb), (v, x) in base_entries.items()))
    recs = [(kb, nsb, int(op), v if op == Op.PUT else None, x if op == Op.PUT and ttl else None)
            for kb, nsb, op, v, x in ops]
    merged = merge_last_wins(info, [base], _tail(info, recs))
    assert (merged.to_pylist() if merged is not None else []) == _reference(info, base, recs)


@settings(max_examples=150, deadline=None)
@given(
    st.sets(st.tuples(_key, _ns, st.integers(0, 4)), max_size=6),
    st.lists(st.tuples(_key, _ns, st.sampled_from([Op.TIMER_ADD, Op.TIMER_REMOVE]), st.integers(0, 4)),
             max_size=30),
)
def test_timer_merge_equals_the_timer_applier(base_timers, ops):
    base = image_to_table(TIMERS, [((_kg(kb), kb, nsb, ts), None) for kb, nsb, ts in sorted(base_timers)])
    recs = [(kb, nsb, int(op), ts, None) for kb, nsb, op, ts in ops]
    merged = merge_last_wins(TIMERS, [base], _tail(TIMERS, recs))
    assert (merged.to_pylist() if merged is not None else []) == _reference(TIMERS, base, recs)


def test_an_empty_tail_table_changes_nothing():
    base = image_to_table(VALUE, [((0, KEYS[0], NSS[0]), (1, None))])
    empty = _tail(VALUE, [(KEYS[0], NSS[0], Op.PUT.value, 2, None)])[0].slice(0, 0)
    merged = merge_last_wins(VALUE, [base], [empty])
    assert merged is not None and merged.to_pylist() == base.to_pylist()


@pytest.mark.parametrize(("info", "op"), [(VALUE, Op.LIST_APPEND), (TIMERS, Op.PUT)])
def test_an_op_not_valid_for_the_kind_fails_both_paths_alike(info, op):
    recs = [(KEYS[0], NSS[0], int(op), 1, None)]
    base = image_to_table(info, [])
    with pytest.raises(CorruptionError) as fast:
        merge_last_wins(info, [base], _tail(info, recs))
    with pytest.raises(CorruptionError) as ref:
        _reference(info, base, recs)
    assert str(fast.value) == str(ref.value)


def test_list_and_map_merge_use_the_appliers(monkeypatch):
    calls = []
    from statelog.restore import appliers

    orig = appliers.ListApplier.apply

    def spy(self, *args):
        calls.append(args[2])
        return orig(self, *args)

    monkeypatch.setattr(appliers.ListApplier, "apply", spy)
    info = StateInfo("l", StateKind.LIST, pa.int64(), None, None)
    schema = block_schema(pa.int64(), None, True)
    tail = pa.table([pa.array([0, 1], pa.int64()), pa.array([0, 0], pa.uint16()),
                     pa.array([Op.LIST_APPEND.value, Op.LIST_APPEND.value], pa.uint8()),
                     pa.array([KEYS[0]] * 2, pa.binary()), pa.array([NSS[0]] * 2, pa.binary()), pa.nulls(2),
                     pa.array([[1, 2], [3]], pa.list_(pa.int64())), pa.nulls(2, pa.int64())], schema=schema)
    out = merge_python(info, [], [tail])
    assert calls == [Op.LIST_APPEND.value] * 2
    assert out is not None and out.column("value").to_pylist() == [[1, 2, 3]]
