"""The C update of value state (statelog/_ext/fastpath.c) behaves like the Python closure."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

import statelog
import statelog.state.kinds as kinds
from statelog import ValueStateDescriptor
from statelog.errors import StateTypeError


def test_the_extension_is_built():
    assert kinds._fastpath is not None, "statelog/_ext/fastpath.c was not built: run `make test`"


CASES = [
    (pa.int64(), [0, -1, 2**63 - 1, -(2**63), 2**63, True, 1.0, "1", None, 7]),
    (pa.uint64(), [0, 2**64 - 1, 2**64, -1, 2**63, None]),
    (pa.int8(), [127, 128, -128, -129]),
    (pa.float64(), [1.5, 2, True, "x", None, float("inf")]),
    (pa.string(), ["a", "", b"a", 1, None]),
    (pa.bool_(), [True, False, 1, None]),
    (pa.binary(), [b"x", "x", None]),
]


def _run(tmp_path, force_python: bool, monkeypatch, value_type, values, columnar: bool | None = None):
    monkeypatch.setattr(kinds, "_FORCE_PYTHON", force_python)
    job = statelog.open((tmp_path / str(force_python)).as_uri(), writer_options={"columnar": columnar})
    b = job.backend("op")
    st = b.get_state(ValueStateDescriptor("v", value_type))
    assert (type(st.update).__name__ == "ValueUpdate") is (not force_python)
    outcomes = []
    for i, v in enumerate(values):
        b.set_current_key(i % 3)
        try:
            st.update(v)
            outcomes.append(("ok", st.value()))
        except StateTypeError as e:
            outcomes.append(("error", str(e)))
    meta = job.checkpoint()
    job.close()
    restored = statelog.open((tmp_path / str(force_python)).as_uri()).backend("op", restore=meta)
    entries = sorted(restored.get_state(ValueStateDescriptor("v", value_type)).entries(), key=repr)
    return outcomes, entries


@pytest.mark.parametrize("value_type, values", CASES, ids=[str(c[0]) for c in CASES])
def test_c_and_python_updates_agree(tmp_path, monkeypatch, value_type, values):
    c = _run(tmp_path, False, monkeypatch, value_type, values)
    py = _run(tmp_path, True, monkeypatch, value_type, values)
    assert c == py


@pytest.mark.parametrize("value_type, values", CASES, ids=[str(c[0]) for c in CASES])
def test_c_update_on_columnar_buffers_agrees_with_python_on_flat_lists(
    tmp_path, monkeypatch, value_type, values
):
    """The fast configuration against the reference one (pure Python, flat-list buffers)."""
    c = _run(tmp_path / "c", False, monkeypatch, value_type, values, columnar=True)
    py = _run(tmp_path / "py", True, monkeypatch, value_type, values, columnar=False)
    assert c == py


def test_stream_buffers_follow_the_switch(tmp_path):
    for columnar in (True, False):
        job = statelog.open((tmp_path / str(columnar)).as_uri(), writer_options={"columnar": columnar})
        b = job.backend("op")
        b.get_state(ValueStateDescriptor("v", pa.int64()))
        stream = b._streams["v"]
        assert stream.columnar is columnar
        assert type(stream.buf).__name__ == ("RecordBuffer" if columnar else "list")
        job.close()


def test_c_update_respects_back_pressure_and_namespaces(tmp_path):
    job = statelog.open(tmp_path.as_uri(), writer_options={"max_buffered_records": 100})
    b = job.backend("op")
    st = b.get_state(ValueStateDescriptor("v", pa.int64()))
    stream = b._streams["v"]
    for i in range(5_000):
        b.set_current_key(i % 50)
        st.set_namespace(None if i % 2 else ("w", i % 3))
        st.update(i)
        assert stream.buffered <= 101
    meta = job.checkpoint()
    job.close()
    r = statelog.open(tmp_path.as_uri()).backend("op", restore=meta)
    got = {(k, ns): v for k, ns, v in r.get_state(ValueStateDescriptor("v", pa.int64())).entries()}
    want: dict = {}
    for i in range(5_000):
        want[(i % 50, None if i % 2 else ("w", i % 3))] = i
    assert got == want


def test_pure_python_switch():
    code = (
        "import statelog.state.kinds as k; import sys; "
        "sys.exit(0 if k._FORCE_PYTHON else 1)"
    )
    env = {"STATELOG_PURE_PYTHON": "1", "PATH": "/usr/bin:/bin"}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


KEYS = [
    0, 1, -1, 255, 256, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63),  # int64: encoded in C
    2**63, -(2**63) - 1, 10**30,  # big ints: the cached key bytes
    None, 1.5, b"k", ("t", 1),  # other types: the cached key bytes
    "", "a", "user-42", "x" * 127, "x" * 128, "é", "日本", "a\x00b",  # ASCII up to 127 chars in C
]


def test_c_update_writes_the_canonical_key_bytes(tmp_path):
    """The C update encodes int64 and short ASCII str keys itself instead of reading the
    cached key bytes: every key must come out as ``encode_key`` bytes, in the changelog
    block and after a restore."""
    from statelog.changelog import format as fmt
    from statelog.changelog.reader import SegmentReader
    from statelog.keys.encoding import encode_key

    if kinds._FORCE_PYTHON:
        pytest.skip("STATELOG_PURE_PYTHON=1: no C update (the Python closure is checked below)")
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    st = b.get_state(ValueStateDescriptor("v", pa.int64()))
    assert type(st.update).__name__ == "ValueUpdate"
    assert b._streams["v"].columnar
    for i, k in enumerate(KEYS):
        b.set_current_key(k)
        st.update(i)
    meta = job.checkpoint()
    reader = SegmentReader(job.store)
    written = []
    for obj in job.store.list("changelog/"):
        data = job.store.get(obj.key)
        for info in reader.verify_segment(obj.key).blocks:
            if info.state == "v":
                written += fmt.decode_block(data[info.offset : info.offset + info.length], info, obj.key)["key"].to_pylist()
    job.close()
    assert written == [encode_key(k) for k in KEYS]
    restored = statelog.open(tmp_path.as_uri()).backend("op", restore=meta)
    got = {repr(k): v for k, _, v in restored.get_state(ValueStateDescriptor("v", pa.int64())).entries()}
    assert got == {repr(k): i for i, k in enumerate(KEYS)}


# keys equal in Python in changing orders, so that the key cache holds each type first once
COLLIDING = [True, 1, 1.0, 1, True, (1, "a"), (True, "a"), (1.0, "a"), False, 0, -0.0, 0.0, 0,
             2**80, float(2**80), 2**80, ((1.0, (True,)), "n"), ((1, (1,)), "n"), 7.0, 7]


@pytest.mark.parametrize("force_python", [False, True], ids=["c", "python"])
def test_keys_equal_in_python_write_one_key(tmp_path, monkeypatch, force_python):
    """Keys equal in Python (1, True, 1.0) are one key: the C update and the Python closure
    write their normalized bytes (those of the int), whichever type the key cache saw first."""
    from statelog.changelog import format as fmt
    from statelog.changelog.reader import SegmentReader
    from statelog.keys.encoding import encode_key

    monkeypatch.setattr(kinds, "_FORCE_PYTHON", force_python)
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    st = b.get_state(ValueStateDescriptor("v", pa.int64()))
    assert (type(st.update).__name__ == "ValueUpdate") is (not force_python)
    want: dict = {}
    for i, k in enumerate(COLLIDING):
        b.set_current_key(k)
        st.update(i)
        want[k] = i
    meta = job.checkpoint()
    reader = SegmentReader(job.store)
    written = []
    for obj in job.store.list("changelog/"):
        data = job.store.get(obj.key)
        for info in reader.verify_segment(obj.key).blocks:
            if info.state == "v":
                written += fmt.decode_block(data[info.offset : info.offset + info.length], info, obj.key)["key"].to_pylist()
    job.close()
    canonical = {1: 1, 0: 0, 2**80: 2**80, 7: 7}
    assert written == [encode_key(canonical.get(k, k)) for k in COLLIDING]
    assert written[:5] == [encode_key(1)] * 5
    restored = statelog.open(tmp_path.as_uri()).backend("op", restore=meta)
    got = {k: v for k, _, v in restored.get_state(ValueStateDescriptor("v", pa.int64())).entries()}
    assert got == want
    assert len(got) == 6


def _updates_through_the_context(root, monkeypatch, force_python: bool):
    """Value updates with the key context written directly (as the backend's setter
    would), keys of every kind: what each update reads and writes."""
    from statelog.changelog import format as fmt
    from statelog.changelog.reader import SegmentReader

    monkeypatch.setattr(kinds, "_FORCE_PYTHON", force_python)
    job = statelog.open(root.as_uri())
    b = job.backend("op")
    st = b.get_state(ValueStateDescriptor("v", pa.int64()))
    assert (type(st.update).__name__ == "ValueUpdate") is (not force_python)
    ctx = b.key_context
    infos = {}
    for k in KEYS:
        b.set_current_key(k)
        infos[repr(k)] = ctx.key_info
    b.set_current_key(KEYS[0])
    seen = []
    for i, k in enumerate(KEYS):
        # the context alone decides which key an update reads and writes
        ctx.key, ctx.key_info = k, infos[repr(k)]
        st.update(i)
        seen.append(st.value())
    meta = job.checkpoint()
    reader = SegmentReader(job.store)
    written = []
    for obj in job.store.list("changelog/"):
        data = job.store.get(obj.key)
        for info in reader.verify_segment(obj.key).blocks:
            if info.state == "v":
                block = fmt.decode_block(data[info.offset : info.offset + info.length], info, obj.key)
                written += zip(block["key"].to_pylist(), block["key_group"].to_pylist(), strict=True)
    job.close()
    restored = statelog.open(root.as_uri()).backend("op", restore=meta)
    entries = sorted(
        (repr(k), v) for k, _, v in restored.get_state(ValueStateDescriptor("v", pa.int64())).entries()
    )
    return seen, written, entries, infos


def test_c_and_python_updates_read_the_same_key_context(tmp_path, monkeypatch):
    c = _updates_through_the_context(tmp_path / "c", monkeypatch, False)
    py = _updates_through_the_context(tmp_path / "py", monkeypatch, True)
    assert c == py
    seen, written, entries, infos = c
    assert seen == list(range(len(KEYS)))
    assert written == [infos[repr(k)][1:] for k in KEYS]
    assert entries == sorted((repr(k), i) for i, k in enumerate(KEYS))


def test_c_update_reads_any_key_context_object():
    """The C update reads KeyContext's slots at fixed offsets; another object standing in
    for the context (no such slots) is read by attribute, with the same result."""
    import types

    from statelog.state.context import KeyContext

    if kinds._FORCE_PYTHON:
        pytest.skip("STATELOG_PURE_PYTHON=1: no C update")
    desc = ValueStateDescriptor("v", pa.int64())
    slots = KeyContext("op", lambda: 0, False)
    other = types.SimpleNamespace(key=None, key_info=None, clock=lambda: 0, changelog_enabled=False)
    for ctx in (slots, other):
        st = kinds.ValueState(ctx, desc, None)
        assert type(st.update).__name__ == "ValueUpdate"
        for k in ("a", 7, ("t", 1)):
            ctx.key = k
            st.update(len(str(k)))
        assert sorted(map(repr, st.entries())) == sorted(
            repr((k, None, len(str(k)))) for k in ("a", 7, ("t", 1))
        )
    del slots.key
    with pytest.raises(AttributeError, match="key"):
        kinds.ValueState(slots, desc, None).update(1)
