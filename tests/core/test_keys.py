from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statelog.errors import ConfigError, SerializationError
from statelog.keys import (
    KeyGroupRange,
    decode_key,
    encode_key,
    key_group_of,
    key_group_range_for_subtask,
    register_key_type,
    subtask_for_key_group,
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
)
KEYS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8)

SAMPLE = [None, True, False, 0, 1, -1, 2**63 - 1, -(2**63), 2**80, 1.5, "", "user-1", "ü", b"", b"\xff", (1, "a"), ((), (None,))]


@given(KEYS)
def test_roundtrip_keeps_value_and_type(key):
    back = decode_key(encode_key(key))
    assert back == key or (key != key)  # NaN excluded above
    assert type(back) is type(key)


@given(KEYS, KEYS)
def test_distinct_keys_have_distinct_bytes(a, b):
    if type(a) is type(b) and a == b:
        assert encode_key(a) == encode_key(b)
    elif encode_key(a) == encode_key(b):
        # only equal values of identical structure may share bytes
        assert repr(a) == repr(b) or (a == b and a == 0.0)


def test_key_groups_identical_across_processes():
    """A fresh interpreter (different hash seed) computes the same key groups and bytes."""
    here = [(encode_key(k).hex(), key_group_of(k, 128), key_group_of(k, 4096)) for k in SAMPLE]
    code = (
        "import json;from statelog.keys import encode_key,key_group_of;"
        f"ks={SAMPLE!r};"
        "print(json.dumps([(encode_key(k).hex(),key_group_of(k,128),key_group_of(k,4096)) for k in ks]))"
    )
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        )
        import json

        assert [tuple(x) for x in json.loads(out.stdout)] == here


def test_key_groups_are_spread():
    counts = [0] * 128
    for i in range(64_000):
        counts[key_group_of(i, 128)] += 1
    assert min(counts) > 300 and max(counts) < 700


def test_flink_assignment_formula():
    for maxp in (1, 7, 128, 1000):
        for p in range(1, min(maxp, 12) + 1):
            covered = []
            for i in range(p):
                r = key_group_range_for_subtask(maxp, p, i)
                covered.extend(r)
                for kg in r:
                    assert subtask_for_key_group(maxp, p, kg) == i
            assert covered == list(range(maxp))


def test_key_group_range_ops():
    r = KeyGroupRange(10, 20)
    assert len(r) == 11 and 10 in r and 21 not in r
    assert r.intersect(KeyGroupRange(15, 30)) == KeyGroupRange(15, 20)
    assert r.intersect(KeyGroupRange(21, 30)).is_empty
    assert KeyGroupRange.from_json(r.to_json()) == r


def test_unserializable_key_is_a_clear_error():
    class Thing:
        pass

    with pytest.raises(SerializationError, match="register_key_type"):
        encode_key(Thing())


def test_custom_key_type_hook():
    class Point:
        def __init__(self, x: int, y: int) -> None:
            self.x, self.y = x, y

        def __eq__(self, o: object) -> bool:
            return isinstance(o, Point) and (o.x, o.y) == (self.x, self.y)

        def __hash__(self) -> int:
            return hash((self.x, self.y))

    register_key_type(
        Point, "test.Point", lambda p: f"{p.x},{p.y}".encode(), lambda b: Point(*map(int, b.split(b",")))
    )
    p = Point(3, 4)
    assert decode_key(encode_key(p)) == p
    assert decode_key(encode_key(("k", p))) == ("k", p)
    with pytest.raises(ConfigError):
        register_key_type(int, "test.Point", str.encode, bytes.decode)


def test_bad_parallelism_is_refused():
    with pytest.raises(ConfigError, match="parallelism"):
        key_group_range_for_subtask(128, 0, 0)
    with pytest.raises(ConfigError, match="parallelism"):
        key_group_range_for_subtask(128, 129, 0)
    with pytest.raises(ConfigError, match="subtask index"):
        key_group_range_for_subtask(128, 2, 2)


_simple_keys = st.one_of(
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=20),
    st.lists(st.text(max_size=140), max_size=20),
    st.lists(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.binary(max_size=5)), max_size=20),
)


@given(_simple_keys, st.integers(min_value=0, max_value=5))
def test_bulk_key_decoding_equals_decode_key(keys: list, skip: int) -> None:
    """decode_key_array (used by restores of state tables) equals decode_key, types included."""
    import pyarrow as pa

    from statelog.keys import decode_key_array

    arr = pa.array([encode_key(k) for k in keys], pa.binary()).slice(min(skip, len(keys)))
    expected = [decode_key(b) for b in arr.to_pylist()]
    got = decode_key_array(arr)
    assert got == expected and [type(x) for x in got] == [type(x) for x in expected]
    assert decode_key_array(pa.chunked_array([arr, arr], pa.binary())) == expected + expected
