"""The key columns of the state rows (statelog.readers.state): computed a column at a time,
they equal the key-by-key encoding, key group and rendering of every key."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes_py
from statelog.readers.schema import render
from statelog.readers.state import _key_cells

CASES = {
    "int64": [0, 1, -1, 42, 2**63 - 1, -(2**63), *range(1000, 1300)],
    "beyond int64": [2**63, -(2**63) - 1, 5],
    "str": ["", "user-42", "é", "x" * 127, "y" * 200],
    "short str": [f"k{i}" for i in range(300)],
    "mixed": [1, "a", None, (1, "b"), b"raw", 2.5, True],
    "bool": [True, False],
    "int and bool": [1, 2, True],
    "int and float": [1, 2, 3.0, 4.5],
    "integral floats": [1.0, 2.0],
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("maxp", [128, 32768])
def test_key_cells_equal_the_per_key_encoding(name: str, maxp: int) -> None:
    ks: list[Any] = CASES[name]
    cols = _key_cells(ks, None, maxp)
    n = len(ks)
    key_groups = pa.array(cols["key_group"]).cast(pa.int32()).to_pylist()
    key_bytes = pa.array(cols["key_bytes"], pa.binary()).to_pylist()
    shown = pa.array(cols["key"], pa.string()).to_pylist()
    assert key_bytes == [encode_key(k) for k in ks]
    assert key_groups == [key_group_of_bytes_py(encode_key(k), maxp) for k in ks]
    assert shown == [render(k) for k in ks]
    assert len(key_groups) == len(key_bytes) == len(shown) == n


def test_typed_keys_keep_their_type() -> None:
    cols = _key_cells([3, 1, 2], pa.int64(), 128)
    assert "key_bytes" not in cols
    assert pa.array(cols["key"], pa.int64()).to_pylist() == [3, 1, 2]
    assert pa.array(cols["key_group"]).to_pylist() == [key_group_of_bytes_py(encode_key(k), 128) for k in (3, 1, 2)]



class UserId(int):
    """A registered key type that subclasses int: Arrow would infer its keys as int64."""


def test_a_registered_int_subclass_is_encoded_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from statelog.keys import encoding

    monkeypatch.setitem(encoding._custom_by_type, UserId, ("test.UserId", lambda u: str(int(u)).encode()))
    ks: list[Any] = [UserId(5), 7, UserId(9)]
    cols = _key_cells(ks, None, 128)
    assert pa.array(cols["key_bytes"], pa.binary()).to_pylist() == [encode_key(k) for k in ks]
    assert encode_key(UserId(5)) != encode_key(5)  # (the custom encoding, not the int's)
    assert pa.array(cols["key"], pa.string()).to_pylist() == [render(k) for k in ks]
