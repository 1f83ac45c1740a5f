from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from statelog.arrays import binary_array, booleans, integer_numpy, numpy_integers
from statelog.errors import ConfigError, SerializationError
from statelog.keys.encoding import decode_key, encode_key, register_key_type
from statelog.keys.groups import (
    KeyGroupRange,
    key_group_of,
    key_group_range_for_subtask,
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


def canonical(key):
    """The Python value a key decodes to under key encoding 2 (the test's model)."""
    if type(key) is bool:
        return int(key)
    if type(key) is float and key.is_integer():
        return int(key)
    if type(key) is tuple:
        return tuple(canonical(x) for x in key)
    return key


def types_of(key):
    return (type(key), tuple(types_of(x) for x in key)) if type(key) is tuple else type(key)


@given(KEYS)
def test_roundtrip_keeps_value_and_normalizes_type(key):
    back = decode_key(encode_key(key))
    assert back == key
    assert types_of(back) == types_of(canonical(key))


@given(KEYS, KEYS)
def test_keys_have_equal_bytes_iff_equal_in_python(a, b):
    assert (a == b) == (encode_key(a) == encode_key(b)), (a, b)


COLLIDING = [
    [1, True, 1.0],
    [0, False, 0.0, -0.0],
    [(1, "a"), (True, "a"), (1.0, "a")],
    [((0, (1,)), "x"), ((False, (True,)), "x"), ((-0.0, (1.0,)), "x")],
    [2**80, float(2**80)],
    [int(1e300), 1e300],
    [-(2**63), float(-(2**63))],
]


@pytest.mark.parametrize("group", COLLIDING, ids=lambda g: repr(g[0]))
def test_keys_equal_in_python_have_one_encoding_and_key_group(group):
    first = encode_key(group[0])
    for k in group[1:]:
        assert k == group[0]
        assert encode_key(k) == first
        assert key_group_of(k, 128) == key_group_of(group[0], 128)
    assert types_of(decode_key(first)) == types_of(canonical(group[0]))


def test_normalized_examples():
    assert encode_key(True).hex() == "038000000000000001"
    assert encode_key(False).hex() == "038000000000000000"
    assert encode_key(-0.0) == encode_key(0.0) == encode_key(0)
    assert encode_key(1e300)[0] == 0x04  # the big int it equals
    assert encode_key(1.5).hex() == "053ff8000000000000"
    assert encode_key(float("inf")).hex() == "057ff0000000000000"
    assert encode_key(float("-inf")).hex() == "05fff0000000000000"
    assert encode_key(float("inf")) != encode_key(float("-inf"))


@pytest.mark.parametrize("key", [float("nan"), -float("nan"), ("a", float("nan")), (1, (float("nan"),))])
def test_nan_key_is_refused(key):
    with pytest.raises(SerializationError, match="NaN.*map NaN to None or to a string"):
        encode_key(key)


def test_version_1_bytes_still_decode():
    """Key encoding 1 wrote bools with their own tags and integral floats as floats."""
    from statelog.keys.encoding import is_legacy_key

    assert decode_key(bytes.fromhex("02")) is True
    assert decode_key(bytes.fromhex("01")) is False
    one = decode_key(bytes.fromhex("053ff0000000000000"))
    assert type(one) is float and one == 1
    tup = decode_key(bytes.fromhex("0802" "02" "0601" "61"))
    assert tup == (True, "a") and is_legacy_key(tup)
    assert not is_legacy_key(decode_key(encode_key((True, 1.0, "a"))))


def test_first_legacy_key_finds_version_1_bytes():
    import pyarrow as pa

    from statelog.keys.columns import first_legacy_key

    v2 = [encode_key(k) for k in [1, True, "a", (1.0, "b"), 1.5, None, b"x", 2**80]]
    assert first_legacy_key(pa.array(v2, pa.binary())) is None
    old_true = bytes.fromhex("0802" "02" "0601" "61")
    assert first_legacy_key(pa.array([*v2, old_true], pa.binary())) == old_true
    assert first_legacy_key(pa.array([bytes.fromhex("053ff0000000000000")], pa.binary())) is not None


def test_keys_convert_to_a_declared_column_type():
    import pyarrow as pa

    from statelog.keys.columns import coerce_key, decode_key_array

    stored = pa.array([encode_key(k) for k in [1.0, 2.5, -0.0]], pa.binary())
    assert decode_key_array(stored) == [1, 2.5, 0]
    got = decode_key_array(stored, pa.float64())
    assert got == [1.0, 2.5, 0.0] and all(type(x) is float for x in got)
    flags = pa.array([encode_key(k) for k in [True, False]], pa.binary())
    assert decode_key_array(flags) == [1, 0]
    assert decode_key_array(flags, pa.bool_()) == [True, False]
    assert [type(x) for x in decode_key_array(flags, pa.bool_())] == [bool, bool]
    assert decode_key_array(pa.array([bytes.fromhex("02")], pa.binary()), pa.int64()) == [1]
    assert coerce_key(None, pa.bool_()) is None
    assert coerce_key("s", pa.string()) == "s"
    with pytest.raises(SerializationError, match=r"declared key type is bool, but the state holds key 2 of type int, which is not a boolean"):
        coerce_key(2, pa.bool_())
    with pytest.raises(SerializationError, match=r"declared key type is int64, but the state holds key 1.5 of type float, which is not an integer; declare a floating type"):
        decode_key_array(pa.array([encode_key(1.5)], pa.binary()), pa.int64())
    with pytest.raises(SerializationError, match="declared key type is double, but .* which no binary64 float equals"):
        coerce_key(2**53 + 1, pa.float64())


def test_key_groups_identical_across_processes():
    """A fresh interpreter (different hash seed) computes the same key groups and bytes."""
    here = [(encode_key(k).hex(), key_group_of(k, 128), key_group_of(k, 4096)) for k in SAMPLE]
    code = (
        "import json;from statelog.keys.encoding import encode_key;from statelog.keys.groups import key_group_of;"
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


def test_the_c_key_group_equals_the_reference():
    """statelog/_ext/workingset.c's key group (murmur3 fmix32 of zlib's CRC-32) is the
    reference's on random key bytes and every max parallelism shape."""
    from statelog import _ext
    from statelog.keys.groups import key_group_of_bytes, key_group_of_bytes_py

    c = _ext.load("workingset")
    if c is None:
        assert _ext.FORCE_PYTHON, "statelog/_ext/workingset.c is not built (make venv builds it)"
        assert key_group_of_bytes is key_group_of_bytes_py
        return
    assert key_group_of_bytes is c.key_group
    rnd = random.Random(5)
    for _ in range(20_000):
        kb = rnd.randbytes(rnd.randrange(0, 300))
        maxp = rnd.choice([1, 2, 7, 128, 1000, 32768, rnd.randrange(1, 1 << 15)])
        assert c.key_group(kb, maxp) == key_group_of_bytes_py(kb, maxp)
    for k in SAMPLE:
        assert c.key_group(encode_key(k), 4096) == key_group_of_bytes_py(encode_key(k), 4096)
    with pytest.raises(ValueError, match="max_parallelism must be positive"):
        c.key_group(b"x", 0)


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

    from statelog.keys.columns import decode_key_array

    arr = pa.array([encode_key(k) for k in keys], pa.binary()).slice(min(skip, len(keys)))
    expected = [decode_key(b) for b in arr.to_pylist()]
    got = decode_key_array(arr)
    assert got == expected and [type(x) for x in got] == [type(x) for x in expected]
    assert decode_key_array(pa.chunked_array([arr, arr], pa.binary())) == expected + expected


@pytest.mark.parametrize("values", [[], [b""], [b"a", b"", b"xyz" * 100, bytes(range(256))]])
def test_binary_array_equals_pa_array(values: list[bytes]) -> None:
    arr = binary_array(values)
    arr.validate(full=True)
    assert arr.type == pa.binary() and arr.to_pylist() == values


def test_integer_numpy_equals_to_numpy() -> None:
    a = pa.array(range(10), pa.uint16())
    for col in (a, a.slice(3, 4), pa.chunked_array([a.slice(2, 3), a.slice(7)]), pa.chunked_array([], pa.int64()),
                pa.array([1, None], pa.int32()), pa.array([0.5, 1.5])):  # fmt: skip
        assert np.array_equal(integer_numpy(col), col.to_numpy(zero_copy_only=False), equal_nan=True)


def test_numpy_integers_equals_pa_array() -> None:
    x = np.arange(20, dtype=np.int64)
    for values in (x, x[3:9], x[::3], np.array([], np.int64), np.arange(5, dtype=np.uint16)):
        assert numpy_integers(values).equals(pa.array(values))


@pytest.mark.parametrize("values", [[], [True], [True, False, True] * 5, [False] * 17, [True] * 64])
def test_booleans_equals_pa_array(values: list[bool]) -> None:
    arr = booleans(np.array(values, bool))
    arr.validate(full=True)
    assert arr.equals(pa.array(values, pa.bool_())) and arr.null_count == 0


def test_decode_key_array_equals_decode_key_per_key():
    """The bulk decoding (numpy over the buffers) gives what decode_key gives key by key, for
    int and string columns, sliced or chunked, mixed columns and strings past the one-byte length."""
    import pyarrow as pa

    from statelog.keys.columns import decode_key_array
    from statelog.keys.encoding import decode_key, encode_key

    columns = [
        [0, -1, 7, 2**63 - 1, -(2**63)],
        ["user-1", "", "héllo", "x" * 127, "日本語"],
        ["a" * 128, "b"],  # a two-byte length: key by key
        ["a", 1, (1, "b"), None, 2.5],
        ["only"],
    ]
    for keys in columns:
        arr = pa.array([encode_key(k) for k in keys], pa.binary())
        want = [decode_key(b) for b in arr.to_pylist()]
        assert decode_key_array(arr) == want
        assert decode_key_array(arr.slice(1)) == want[1:]
        assert decode_key_array(pa.chunked_array([arr.slice(0, 2), arr.slice(2)])) == want


def test_decode_key_array_refuses_malformed_utf8_strings():
    import pyarrow as pa
    import pytest

    from statelog.errors import CorruptionError
    from statelog.keys.columns import decode_key_array
    from statelog.keys.encoding import encode_key

    good = encode_key("ab")
    bad = good[:2] + b"\xff\xfe"
    with pytest.raises(CorruptionError, match="malformed"):
        decode_key_array(pa.array([good, bad], pa.binary()))
