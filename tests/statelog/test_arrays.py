"""statelog.arrays: take_array and take_table against Arrow's own take."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statelog.arrays import take_array, take_table

COLUMNS = {
    "int64": pa.array([5, None, -3, 7, 1 << 40, None, 0], pa.int64()),
    "uint16": pa.array([1, 2, 3, 65535, 0, 9, 4], pa.uint16()),
    "uint8_nulls": pa.array([1, None, 3, None, 0, 9, 4], pa.uint8()),
    "float64": pa.array([0.5, -0.0, None, float("inf"), 2.0, 3.5, None]),
    "float32": pa.array([0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], pa.float32()),
    "binary": pa.array([b"", b"a", b"bc", None, b"\x00\xff", b"long" * 10, b"z"], pa.binary()),
    "string": pa.array(["x", "", None, "héllo", "a", "bb", "ccc"], pa.string()),
    "null": pa.nulls(7),
    "list": pa.array([[1], [], None, [2, 3], [4], [5], [6]], pa.list_(pa.int64())),
    "bool": pa.array([True, False, None, True, True, False, True]),
}


@pytest.mark.parametrize("name", sorted(COLUMNS))
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_take_array_equals_arrow_take(name: str, offset: int) -> None:
    arr = COLUMNS[name].slice(offset)
    rng = np.random.default_rng(len(name) + offset)
    for rows in (np.arange(len(arr)), np.array([], np.int64), rng.integers(0, len(arr), 20), np.array([len(arr) - 1, 0])):
        got = take_array(arr, rows)
        want = arr.take(pa.array(rows, pa.int64()))
        assert got.type == arr.type
        assert got.to_pylist() == want.to_pylist()
        assert got.null_count == want.null_count
        got.validate(full=True)


def test_take_array_of_a_chunked_array() -> None:
    arr = pa.chunked_array([pa.array([b"a", None]), pa.array([b"ccc", b"dd"])])
    assert take_array(arr, np.array([3, 0, 1, 2])).to_pylist() == [b"dd", b"a", None, b"ccc"]


def test_take_table_keeps_the_schema() -> None:
    t = pa.table({k: v for k, v in COLUMNS.items()})
    rows = np.array([6, 2, 2, 0])
    got = take_table(t, rows)
    assert got.schema == t.schema
    assert got.to_pylist() == t.take(pa.array(rows)).to_pylist()


@pytest.mark.parametrize("value", [b"", b"ns", b"\x00\x01\x02"])
def test_all_equal_bytes(value: bytes) -> None:
    from statelog.arrays import all_equal_bytes

    same = pa.chunked_array([pa.array([value] * 3, pa.binary()), pa.array([value] * 2, pa.binary())])
    assert all_equal_bytes(same, value)
    assert all_equal_bytes(pa.array([b"x", value, value], pa.binary()).slice(1), value)
    for other in (b"x" + value, value + b"y", value[:-1] if value else b"z", bytes(len(value) or 1)):
        if other == value:
            continue
        mixed = pa.array([value, value, other, value], pa.binary())
        assert not all_equal_bytes(mixed, value)
        assert not all_equal_bytes(pa.chunked_array([pa.array([value], pa.binary()), mixed]), value)
    assert not all_equal_bytes(pa.array([value, None], pa.binary()), value)


def test_take_table_of_one_run_is_a_slice() -> None:
    t = pa.table({"a": pa.array(range(10)), "b": pa.array([[i] for i in range(10)])})
    got = take_table(t, np.arange(3, 7))
    assert got.to_pylist() == t.slice(3, 4).to_pylist()
    assert take_table(t, np.array([], np.int64)).num_rows == 0
