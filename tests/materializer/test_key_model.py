"""One key model everywhere: keys follow Python equality, so keys equal in
Python (``1``, ``True``, ``1.0``; tuples of them) are one key in the live state, the
changelog, a restore and a materialization."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from statelog import ValueStateDescriptor
from statelog.changelog.reader import SegmentReader
from statelog.errors import SerializationError
from statelog.keys.encoding import decode_key, encode_key
from statelog.keys.groups import key_group_of_bytes

V = ValueStateDescriptor("v", pa.int64())
NS_V = ValueStateDescriptor("nv", pa.int64())
WRITES: list[tuple[Any, int]] = [
    (1, 10), (True, 20), (1.0, 30),
    ((1, "a"), 40), ((True, "a"), 50), ((1.0, "a"), 60),
]
EXPECTED = {1: 30, (1, "a"): 60}


def _live(b: Any) -> dict[Any, Any]:
    return {k: v for k, _ns, v in b.entries("v")}


def _restored(root: str, cid: int) -> dict[Any, Any]:
    with statelog.open(root) as job:
        b = job.backend("op", restore=cid, changelog=False)
        b.get_state(V)
        return _live(b)


def test_keys_equal_in_python_are_one_key_in_every_layer(tmp_path):
    root = tmp_path.as_uri()
    job = statelog.open(root, writer_options={"coalesce": False})
    job.materialization_poll_s = 0
    b = job.backend("op")
    st = b.get_state(V)
    for key, value in WRITES:
        b.set_current_key(key)
        st.update(value)
    # live state
    assert _live(b) == EXPECTED
    for key in (1, True, 1.0):
        b.set_current_key(key)
        assert st.value() == 30
    meta = job.checkpoint()
    # the changelog: every record of one Python key has the same bytes and key group
    records = []
    handle = meta.operators["op"].subtasks[0]
    reader = SegmentReader(job.store)
    for r in handle.changelog:
        if not r.stream.endswith("/v"):
            continue
        for batch in reader.read_range(r.stream, r.start, r.end, r.key_groups, r.segments):
            for _seq, kg, _op, kb, _nsb, _uk, value, _exp in batch.rows():
                records.append((kg, kb, value))
    assert [v for _kg, _kb, v in records] == [10, 20, 30, 40, 50, 60]
    assert {kb for _kg, kb, v in records if v <= 30} == {encode_key(1)}
    assert {kb for _kg, kb, v in records if v > 30} == {encode_key((1, "a"))}
    assert all(kg == key_group_of_bytes(kb, job.max_parallelism) for kg, kb, _v in records)
    replayed: dict[Any, Any] = {}
    for _kg, kb, value in records:
        replayed[decode_key(kb)] = value
    assert replayed == EXPECTED
    # a restore from the changelog
    assert _restored(root, meta.checkpoint_id) == EXPECTED
    # a materialization of that checkpoint, then a checkpoint built on it, with a colliding
    # key written after it: the base row and the change record are one entry
    m = materialize(job.store, meta)
    assert m.rows == 2
    assert b.adopt_materialization(m)
    b.set_current_key(True)
    st.update(31)
    meta2 = job.checkpoint()
    assert [p.manifest for p in meta2.operators["op"].subtasks[0].materialization] == [m.key]
    job.close()
    got = _restored(root, meta2.checkpoint_id)
    assert got == {1: 31, (1, "a"): 60}
    # the restored keys are the normalized ones (int, tuple of int)
    assert sorted(type(k).__name__ for k in got) == ["int", "tuple"]
    assert type(next(k for k in got if type(k) is tuple)[0]) is int
    with statelog.open(root) as job:
        m3 = materialize(job.store, meta2)
        assert m3.rows == 2


def test_colliding_namespaces_and_timers_are_one(tmp_path):
    root = tmp_path.as_uri()
    job = statelog.open(root)
    b = job.backend("op")
    st = b.get_state(NS_V)
    b.set_current_key("k")
    for i, ns in enumerate([(0, 10), (False, 10.0), (-0.0, 10), (0.0, True * 10)]):
        st.set_namespace(ns)
        st.update(i)
        b.timers.register_event_time_timer(5, ns)
    entries = list(b.entries("nv"))
    assert entries == [("k", (0, 10), 3)]
    assert len(b.timers.timers("event")) == 1
    meta = job.checkpoint()
    job.close()
    with statelog.open(root) as job:
        r = job.backend("op", restore=meta.checkpoint_id)
        r.get_state(NS_V)
        assert list(r.entries("nv")) == [("k", (0, 10), 3)]
        fired = list(r.timers.advance_watermark(10))
        assert [(t.key, t.namespace) for t in fired] == [("k", (0, 10))]


def test_nan_is_refused_as_key_namespace_and_map_key(tmp_path):
    with statelog.open(tmp_path.as_uri()) as job:
        b = job.backend("op")
        st = b.get_state(V)
        mp = b.get_state(statelog.MapStateDescriptor("m", pa.int64(), key_type=pa.float64()))
        pm = b.get_state(statelog.MapStateDescriptor("pm", pa.int64(), key_type=statelog.PICKLE))
        with pytest.raises(SerializationError, match="NaN"):
            b.set_current_key(float("nan"))
        with pytest.raises(SerializationError, match="NaN"):
            b.set_current_key(("a", float("nan")))
        b.set_current_key("k")
        with pytest.raises(SerializationError, match="NaN"):
            st.set_namespace(float("nan"))
        with pytest.raises(SerializationError, match="NaN"):
            mp.put(float("nan"), 1)
        with pytest.raises(SerializationError, match="NaN"):
            pm.put(("x", float("nan")), 1)
        assert mp.keys() == [] and pm.keys() == []
        mp.put(1.5, 1)
        assert mp.get(1.5) == 1


def _v1_encode(real: Any) -> Any:
    """The key encoding of version 1 for ``True`` (tag 0x02), else the current one."""

    def encode(key: Any) -> bytes:
        return b"\x02" if key is True else real(key)

    return encode


def test_a_job_cannot_continue_from_version_1_keys_but_readers_read_them(tmp_path, monkeypatch):
    import statelog.state.backend

    root = tmp_path.as_uri()
    with monkeypatch.context() as mp:
        mp.setattr(statelog.state.backend, "encode_key", _v1_encode(encode_key))
        job = statelog.open(root)
        b = job.backend("op")
        st = b.get_state(V)
        b.set_current_key(True)
        st.update(7)
        meta = job.checkpoint()
        assert b.adopt_materialization(materialize(job.store, meta))
        based = job.checkpoint()  # its state is a materialized table only
        assert based.operators["op"].subtasks[0].materialization
        assert not any(r.stream.endswith("/v") for r in based.operators["op"].subtasks[0].changelog)
        job.close()
    for cid in (meta.checkpoint_id, based.checkpoint_id):
        # a read-only restore (what the Spark data source and the CLI do) reads the old bytes
        assert _restored(root, cid) == {True: 7}
        # a job that would go on writing is refused: its changelog would hold True twice
        for on_demand in (False, True):  # refused when the state registers, or its key group loads
            with statelog.open(root) as job:
                b = job.backend("op", restore=cid, on_demand=on_demand)
                with pytest.raises(SerializationError, match=r"key encoding version 1 \(bytes 02\).*stores it as 1"):
                    b.get_state(V)
                    b.wait_loaded()


def test_version_1_namespaces_are_refused_for_a_writing_restore(tmp_path, monkeypatch):
    import statelog.state.keyed

    root = tmp_path.as_uri()
    with monkeypatch.context() as mp:
        mp.setattr(statelog.state.keyed, "encode_key", _v1_encode(encode_key))
        job = statelog.open(root)
        b = job.backend("op")
        st = b.get_state(NS_V)
        b.set_current_key("k")
        st.set_namespace(True)
        st.update(7)
        meta = job.checkpoint()
        job.close()
    for on_demand in (False, True):
        with statelog.open(root) as job:
            b = job.backend("op", restore=meta.checkpoint_id, on_demand=on_demand)
            with pytest.raises(SerializationError, match="key encoding version 1"):
                b.get_state(NS_V)
                b.wait_loaded()
