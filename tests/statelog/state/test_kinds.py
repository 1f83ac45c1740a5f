"""Semantics of each state kind, TTL and timers, live and after restore."""

from __future__ import annotations

import pyarrow as pa
import pytest

import statelog
from statelog import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    TtlConfig,
    TtlUpdate,
    ValueStateDescriptor,
)
from tests.support.harness import AvgAgg, Clock


@pytest.fixture
def job(tmp_path):
    j = statelog.open(tmp_path.as_uri())
    yield j
    j.close()


def _restore(job, meta, clock=None):
    # a second view of the root beside the open job, to read the restored state: it must
    # not take the writer lease the job holds
    return statelog.open(job.root, writer_lease=False).backend("op", restore=meta, clock=clock)


def test_value_default_and_namespaces(job):
    b = job.backend("op")
    v = b.get_state(ValueStateDescriptor("v", pa.int64(), default=-1))
    b.set_current_key("a")
    assert v.value() == -1
    v.update(1)
    v.set_namespace((0, 10))
    assert v.value() == -1
    v.update(2)
    assert sorted(v.namespaces_of_current_key(), key=repr) == [(0, 10), None]
    v.set_namespace(None)
    assert v.value() == 1
    meta = job.checkpoint()
    r = _restore(job, meta)
    rv = r.get_state(ValueStateDescriptor("v", pa.int64(), default=-1))
    assert sorted(rv.entries(), key=repr) == sorted([("a", None, 1), ("a", (0, 10), 2)], key=repr)


def test_list_map_reducing_aggregating(job):
    b = job.backend("op")
    lst = b.get_state(ListStateDescriptor("l", pa.int64()))
    m = b.get_state(MapStateDescriptor("m", pa.string(), key_type=pa.int64()))
    red = b.get_state(ReducingStateDescriptor("r", pa.int64(), reduce_fn=max))
    agg = b.get_state(AggregatingStateDescriptor("a", statelog.PICKLE, aggregate=AvgAgg()))
    b.set_current_key(7)
    lst.add_all([3, 1])
    lst.add(2)
    got = lst.get()
    got.append(99)  # a copy: mutating it does not change state
    assert lst.get() == [3, 1, 2]
    m.put_all({1: "a", 2: "b"})
    m.remove(1)
    m.remove(5)  # absent: no-op
    assert m.items() == [(2, "b")] and m.contains(2) and not m.contains(1)
    for x in (4, 9, 2):
        red.add(x)
        agg.add(x)
    assert red.get() == 9 and agg.get() == 5.0
    meta = job.checkpoint()
    r = _restore(job, meta)
    r.set_current_key(7)
    assert r.get_state(ListStateDescriptor("l", pa.int64())).get() == [3, 1, 2]
    assert r.get_state(MapStateDescriptor("m", pa.string(), key_type=pa.int64())).items() == [(2, "b")]
    assert r.get_state(ReducingStateDescriptor("r", pa.int64(), reduce_fn=max)).get() == 9
    assert r.get_state(AggregatingStateDescriptor("a", statelog.PICKLE, aggregate=AvgAgg())).get() == 5.0
    m.remove(2)
    assert m.is_empty() and m.get(2, "dflt") == "dflt"


def test_ttl_expiry_and_refresh_on_read(tmp_path):
    clock = Clock(1000)
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op", clock=clock)
    write = b.get_state(ValueStateDescriptor("w", pa.int64(), ttl=TtlConfig(100)))
    read = b.get_state(
        ValueStateDescriptor("r", pa.int64(), ttl=TtlConfig(100, TtlUpdate.ON_READ_AND_WRITE))
    )
    lst = b.get_state(ListStateDescriptor("l", pa.int64(), ttl=TtlConfig(100)))
    mp = b.get_state(MapStateDescriptor("m", pa.int64(), key_type=pa.string(), ttl=TtlConfig(100)))
    b.set_current_key("k")
    write.update(1)
    read.update(2)
    lst.add(1)
    mp.put("old", 1)
    clock.now = 1060
    assert read.value() == 2  # refreshes expiry to 1160
    lst.add(2)
    mp.put("new", 2)
    clock.now = 1120
    assert write.value() is None  # expired at 1100
    assert lst.get() == [2] and mp.items() == [("new", 2)]
    meta = job.checkpoint()
    job.close()
    r = _restore(job, meta, clock)
    r.set_current_key("k")
    assert r.get_state(ValueStateDescriptor("w", pa.int64(), ttl=TtlConfig(100))).value() is None
    rr = r.get_state(ValueStateDescriptor("r", pa.int64(), ttl=TtlConfig(100, TtlUpdate.ON_READ_AND_WRITE)))
    assert rr.value() == 2  # the refresh was part of the changelog
    clock.now = 1300
    assert rr.value() is None


def test_timers_order_dedupe_and_firing(job):
    b = job.backend("op")
    t = b.timers
    for key, ts in [("b", 30), ("a", 10), ("c", 20), ("a", 10), ("a", 40)]:
        b.set_current_key(key)
        t.register_event_time_timer(ts, namespace=("w", ts))
    b.set_current_key("a")
    t.delete_event_time_timer(40, namespace=("w", 40))
    t.register_processing_time_timer(5)
    assert [(x.timestamp, x.key) for x in t.timers("event")] == [(10, "a"), (20, "c"), (30, "b")]
    meta = job.checkpoint()
    fired = [(x.timestamp, x.key, x.namespace) for x in t.advance_watermark(25)]
    assert fired == [(10, "a", ("w", 10)), (20, "c", ("w", 20))]
    assert b.current_key == "c"  # firing sets the current key
    assert [x.key for x in t.advance_processing_time(100)] == ["a"]
    assert t.next_timestamp("event") == 30
    r = _restore(job, meta)  # timers at the checkpoint, before firing
    assert [(x.timestamp, x.key) for x in r.timers.timers("event")] == [(10, "a"), (20, "c"), (30, "b")]
    assert [x.timestamp for x in r.timers.timers("processing")] == [5]
