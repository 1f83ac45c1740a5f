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

