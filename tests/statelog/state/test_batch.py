"""The batch calls of the state kinds: key groups a column at a time with the per-record
hash, refused keys, TTL, namespaces, reductions, and the changelog part of a call."""

from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import statelog
from statelog import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    TtlConfig,
    ValueStateDescriptor,
)
from statelog.errors import KeyGroupError, StateTypeError
from statelog.keys.batch import encode_keys, key_groups_numpy, key_groups_of
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes, key_group_of_bytes_py
from statelog.state.batch import BatchReduction, CountAggregate
from statelog.state.batch_reductions import group_numpy
from tests.support.harness import Clock

MIXED = [0, 1, -1, 2**63 - 1, -(2**63), 2**80, "", "a", "é" * 40, "x" * 127, "y" * 128, b"\x00k",
         None, 2.5, -0.0, 7.0, True, (1, "x"), ((1, (2,)), "n")]


@pytest.fixture
def job(tmp_path):
    j = statelog.open(tmp_path.as_uri())
    yield j
    j.close()


def _restore(job, meta, clock=None):
    return statelog.open(job.root, writer_lease=False).backend("op", restore=meta, clock=clock)


@pytest.mark.parametrize("keys", [
    pa.array(np.arange(-3000, 3000, 7)),
    pa.array([2**63 - 1, -(2**63), 0], pa.int64()),
    pa.array([1, 2, 3], pa.int8()),
    pa.chunked_array([[1, 2], [3]]),
    pa.array(["", "a", "é" * 40, "x" * 127]),
    pa.array(["short", "y" * 200]),
    pa.array(["a", None]),
    pa.array([b"k", b""]),
    MIXED,
    list(range(500)),
], ids=lambda k: type(k).__name__ + str(len(k)))
@pytest.mark.parametrize("maxp", [1, 128, 32768])
def test_key_groups_of_a_column_equal_the_per_record_hash(keys, maxp):
    pykeys, kbs = encode_keys(keys)
    assert kbs.to_pylist() == [encode_key(k) for k in pykeys]
    kgs = key_groups_of(kbs, maxp).tolist()
    assert kgs == [key_group_of_bytes(encode_key(k), maxp) for k in pykeys]
    assert kgs == [key_group_of_bytes_py(encode_key(k), maxp) for k in pykeys]


@pytest.mark.parametrize("maxp", [1, 128, 65536])
def test_key_groups_in_c_equal_the_numpy_reference_on_slices(maxp):
    """``key_groups_of`` (in C when built) and its numpy reference agree on sliced columns
    (an offset into the buffers) of fixed-width and variable-width keys."""
    for keys in (pa.array(np.arange(-5000, 5000, 3)), pa.array([f"k{i}" * (i % 5) for i in range(3000)])):
        _, kbs = encode_keys(keys)
        for part in (kbs, kbs.slice(17), kbs.slice(5, 40), kbs.slice(0, 0)):
            assert key_groups_of(part, maxp).tolist() == key_groups_numpy(part, maxp).tolist()


def test_key_groups_in_c_refuse_offsets_past_the_data():
    from statelog._ext import load

    ext = load("workingset")
    if ext is None:
        pytest.skip("statelog/_ext/workingset.c is not built")
    out = np.zeros(2, np.uint16)
    with pytest.raises(ValueError, match="offsets out of order or past the data"):
        ext.key_groups(np.array([0, 4, 2], np.int32), b"abcd", 128, out)
    with pytest.raises(ValueError, match="offsets out of order or past the data"):
        ext.key_groups(np.array([0, 4, 9], np.int32), b"abcd", 128, out)
    with pytest.raises(ValueError, match="max_parallelism"):
        ext.key_groups(np.array([0, 1, 2], np.int32), b"ab", 0, out)
    with pytest.raises(ValueError, match="offsets must hold 3 items"):
        ext.key_groups(np.array([0, 1], np.int32), b"ab", 128, out)


def test_batch_keys_of_other_subtasks_are_refused(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op", subtask=0, parallelism=2)
    v = b.get_state(ValueStateDescriptor("v", pa.int64()))
    s = b.get_state(ReducingStateDescriptor("s", pa.int64(), reduce_fn=operator.add))
    mine = next(k for k in range(1000) if statelog.key_group_of(k, 128) in b.key_groups)
    other = next(k for k in range(1000) if statelog.key_group_of(k, 128) not in b.key_groups)
    for call in (lambda: v.put_many([mine, other], [1, 2]), lambda: v.get_many(pa.array([other])),
                 lambda: s.add_many(pa.array([mine, other]), [1, 1]), lambda: v.delete_many([other])):
        with pytest.raises(KeyGroupError, match=f"key {other} is in key group"):
            call()
    assert list(v.entries()) == [] and list(s.entries()) == []
    job.close()


def test_value_batch_calls_equal_single_calls_and_restore(job):
    b = job.backend("op")
    v = b.get_state(ValueStateDescriptor("v", pa.int64(), default=-1))
    b.set_current_key("before")
    v.put_many(pa.array([1, 2, 3, 1]), pa.array([10, 20, 30, 11]))
    v.set_namespace("w")
    v.put_many(["a", "b"], [5, None])  # None clears, as update(None)
    assert v.get_many(["a", "b"]).to_pylist() == [5, -1]
    v.set_namespace(None)
    assert v.get_many(pa.array([1, 2, 3, 4])).to_pylist() == [11, 20, 30, -1]
    v.delete_many([2, 9])
    assert b.current_key == "before"  # a batch call leaves the current key
    b.set_current_key(1)
    assert v.value() == 11
    with pytest.raises(StateTypeError, match="do not fit the declared type"):
        v.put_many([1], ["not an int"])
    meta = job.checkpoint(sources={})
    r = _restore(job, meta)
    rv = r.get_state(ValueStateDescriptor("v", pa.int64(), default=-1))
    assert sorted(rv.entries(), key=repr) == sorted([(1, None, 11), (3, None, 30), ("a", "w", 5)], key=repr)


def test_reductions_and_a_plugged_in_one(job):
    b = job.backend("op")
    total = b.get_state(ReducingStateDescriptor("sum", pa.int64(), reduce_fn=operator.add))
    low = b.get_state(ReducingStateDescriptor("min", pa.int64(), reduce_fn=min))
    count = b.get_state(AggregatingStateDescriptor("count", pa.int64(), aggregate=CountAggregate()))

    def product(a: int, c: int) -> int:
        return a * c

    product.batch_reduction = BatchReduction("product", pc.multiply_checked, 1)  # type: ignore[attr-defined]
    prod = b.get_state(ReducingStateDescriptor("prod", pa.int64(), reduce_fn=product))
    keys = pa.array(["a", "b", "a", "c", "a"])
    vals = pa.array([3, 4, 5, -1, 2])
    for st in (total, low, prod):
        st.add_many(keys, vals)
        st.add_many(["a"], [2])
    count.add_many(keys)
    count.add_many(["c"], [None])  # counted, as add(None) is
    count.add_many(pa.array([("x", 1)], pa.struct([("k", pa.string()), ("n", pa.int64())])).field("k"),
                   pa.array([None], pa.int64()))
    got = {name: {k: v for k, _, v in st.entries()} for name, st in
           (("sum", total), ("min", low), ("prod", prod), ("count", count))}
    assert got == {"sum": {"a": 12, "b": 4, "c": -1}, "min": {"a": 2, "b": 4, "c": -1},
                   "prod": {"a": 60, "b": 4, "c": -1}, "count": {"a": 3, "b": 1, "c": 2, "x": 1}}


def test_ttl_and_lists_in_batch_calls(job):
    clock = Clock(1000)
    b = job.backend("op", clock=clock)
    t = b.get_state(ValueStateDescriptor("t", pa.int64(), ttl=TtlConfig(50)))
    lst = b.get_state(ListStateDescriptor("l", pa.string()))
    t.put_many([1, 2], [7, 8])
    clock.now += 30
    t.put_many([2], [9])
    clock.now += 30
    assert t.get_many([1, 2, 3]).to_pylist() == [None, 9, None]
    lst.add_many(pa.array([1, 2, 1]), ["x", "y", "z"])
    b.set_current_key(1)
    lst.add("w")
    lst.add_many([1], ["v"])
    assert lst.get() == ["x", "z", "w", "v"]
    meta = job.checkpoint(sources={})
    r = _restore(job, meta, clock)
    assert r.get_state(ValueStateDescriptor("t", pa.int64(), ttl=TtlConfig(50))).get_many([1, 2]).to_pylist() == [None, 9]
    rl = r.get_state(ListStateDescriptor("l", pa.string()))
    assert sorted(rl.entries()) == [(1, None, ["x", "z", "w", "v"]), (2, None, ["y"])]


def test_a_batch_call_is_one_part_of_arrow_columns_with_the_per_record_records(job):
    b = job.backend("op")
    s = b.get_state(ReducingStateDescriptor("s", pa.int64(), reduce_fn=operator.add))
    stream = s._stream
    keys = pa.array(np.arange(1000) % 300)
    s.add_many(keys, pa.array(np.ones(1000, np.int64)))
    assert len(stream.buf) == 0  # nothing per record
    assert len(stream.encoded) == 1
    start, count, batches = stream.encoded[0]
    assert (start, count, len(batches)) == (0, 300, 1)
    batch = batches[0].batch
    assert batch.column(0).to_pylist() == list(range(300))  # seq
    got = {encode_key(k): v for k, v in zip(range(300), [4 if k < 100 else 3 for k in range(300)], strict=True)}
    assert dict(zip(batch.column(3).to_pylist(), batch.column(6).to_pylist(), strict=True)) == got
    assert batch.column(1).to_pylist() == [key_group_of_bytes(kb, 128) for kb in batch.column(3).to_pylist()]
    # per-record calls after it take the following sequence numbers
    b.set_current_key(5)
    s.add(1)
    assert stream.position == 301


@pytest.mark.parametrize("cache_entries", [4, None])
def test_batch_calls_on_the_disk_working_set(tmp_path, cache_entries):
    """Keys resident after the batch's prefetch are written in the resident dicts; with a
    cache of 4 entries most are not, and go through the working set key by key."""
    job = statelog.open(tmp_path.as_uri(), state_store="disk")
    if cache_entries is not None:
        job.state_cache_entries = cache_entries
    b = job.backend("op")
    s = b.get_state(ReducingStateDescriptor("s", pa.int64(), reduce_fn=operator.add))
    v = b.get_state(ValueStateDescriptor("v", pa.int64()))
    lst = b.get_state(ListStateDescriptor("l", pa.string()))
    for k in range(10):  # lists that exist before the batch, resident or written back by it
        b.set_current_key(k)
        lst.add(f"r{k}")
    lst.add_many(list(range(700)) + [3, 3], [f"b{k}" for k in range(700)] + ["c", "d"])
    keys = pa.array(np.arange(3000) % 700)
    s.add_many(keys, pa.array(np.ones(3000, np.int64)))
    s.add_many(pa.array([1, 2]), [10, 10])
    v.put_many(pa.array(np.arange(700)), pa.array(np.arange(700) * 2))
    v.delete_many(list(range(0, 700, 2)))
    b.set_current_key(1)
    s.add(1)
    want_s = {k: (5 if k < 200 else 4) + (11 if k == 1 else 10 if k == 2 else 0) for k in range(700)}
    want_v = {k: 2 * k for k in range(1, 700, 2)}
    assert {k: x for k, _, x in s.entries()} == want_s
    assert v.get_many(pa.array(np.arange(700))).to_pylist() == [want_v.get(k) for k in range(700)]
    want_l = {k: ([f"r{k}"] if k < 10 else []) + [f"b{k}"] + (["c", "d"] if k == 3 else []) for k in range(700)}
    assert {k: x for k, _, x in lst.entries()} == want_l
    meta = job.checkpoint(sources={})
    job.close()
    job = statelog.open(tmp_path.as_uri(), state_store="disk")
    r = job.backend("op", restore=meta)
    rs = r.get_state(ReducingStateDescriptor("s", pa.int64(), reduce_fn=operator.add))
    rv = r.get_state(ValueStateDescriptor("v", pa.int64()))
    assert {k: x for k, _, x in rs.entries()} == want_s
    assert {k: x for k, _, x in rv.entries()} == want_v
    assert {k: x for k, _, x in r.get_state(ListStateDescriptor("l", pa.string())).entries()} == want_l
    job.close()


@pytest.mark.parametrize("aggregation", ["count", "sum", "min", "max"])
@pytest.mark.parametrize("case", ["small", "negative", "wide keys", "wide values", "uint64 values", "one value"])
def test_the_numpy_grouping_equals_arrows_hash_aggregation(aggregation: str, case: str) -> None:
    """group_numpy sorts keys alone (count), keys and values packed into one int64 when both
    fit, or by argsort; each equals pyarrow's group_by."""
    rng = np.random.default_rng(len(case) * 7 + len(aggregation))
    n = 5000
    keys = rng.integers(-50, 300, n, dtype=np.int64)
    vals = rng.integers(0, 100, n, dtype=np.int64)
    if case == "negative":
        vals = rng.integers(-(10**6), 10**6, n, dtype=np.int64)
    elif case == "wide keys":
        keys = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
        keys[::3] = 17
    elif case == "wide values":
        vals = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    elif case == "uint64 values":
        vals = rng.integers(2**63, 2**64 - 1, n, dtype=np.uint64)
    elif case == "one value":
        vals = np.full(n, 5, np.int64)
    if aggregation == "sum" and case in ("wide values", "uint64 values"):
        vals = vals // 2**20  # a sum of them must stay in int64 for the fast path
    karr, varr = pa.array(keys), pa.array(vals)
    got = group_numpy(karr, varr, aggregation)
    assert got is not None
    want = pa.table({"k": karr, "v": varr}).group_by("k").aggregate([("v", aggregation)])
    expect = dict(zip(want.column("k").to_pylist(), want.column(f"v_{aggregation}").to_pylist(), strict=True))
    assert got[0].to_pylist() == sorted(expect)
    assert dict(zip(got[0].to_pylist(), got[1].to_pylist(), strict=True)) == expect
