"""State keys and values as Arrow columns, for the Arrow Flight server of ``statelog serve``
and its client (:mod:`statelog.flight_client`).

A column of keys, namespaces or values is of a plain Arrow type when every value that is not
None is of one plain Python type (``int`` as int64, ``float``, ``str``, ``bool``, ``bytes``),
all None as the null type (encoding ``"arrow"``); anything else is JSON text as
:mod:`statelog.following.json_values` encodes it, None as null (encoding ``"json"``). A
table's schema metadata ``encoding`` names each column's encoding (JSON text).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from statelog.following.json_values import from_json, key_from_json, to_json

__all__ = ["arrow_column", "python_values"]

_NATIVE = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_(), bytes: pa.binary()}


def arrow_column(values: list[Any]) -> tuple[pa.Array, str]:
    """``values`` as an Arrow column and its encoding, ``"arrow"`` or ``"json"`` (the module's doc)."""
    types = set(map(type, values))
    types.discard(type(None))
    if not types:
        return pa.nulls(len(values)), "arrow"
    native = _NATIVE.get(next(iter(types))) if len(types) == 1 else None
    if native is not None:
        try:
            return pa.array(values, native), "arrow"
        except (pa.ArrowException, OverflowError):  # an int beyond int64
            pass
    return pa.array([None if v is None else json.dumps(to_json(v), allow_nan=False) for v in values], pa.string()), "json"


def python_values(table: pa.Table, name: str) -> list[Any]:
    """The values of column ``name`` (``key``, ``namespace`` or ``value``) of ``table`` as Python
    values, decoded as its metadata ``encoding`` says (keys and namespaces with lists as tuples)."""
    values = table.column(name).to_pylist()
    encoding = json.loads((table.schema.metadata or {}).get(b"encoding", b"{}")).get(name, "json")
    if encoding == "arrow":
        return values
    if name == "value":
        return [None if v is None else from_json(json.loads(v)) for v in values]
    return [None if v is None else key_from_json(json.loads(v), name) for v in values]
