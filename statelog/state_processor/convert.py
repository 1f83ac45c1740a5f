"""Rows in the shape of a state's SQL view, checked and turned into that state's table.

Input columns (docs/spark.md, "Rows and columns"; every reader of state gives them):

* the key: ``key_bytes`` (the encoded key, exact: it decides when present) or ``key`` (a
  typed column whose values are encoded with ``encode_key``; a null there is refused, the key
  ``None`` is written as ``key_bytes`` ``00``);
* the namespace: ``namespace_bytes`` (decides when present), else ``namespace`` (values
  encoded, null = the default namespace), else every row in the default namespace;
* the entry: ``value`` of the view's type by kind, or ``value_pickle`` for pickled types,
  and ``expires_ms`` (optional); timers: ``timestamp``;
* ``key_group`` and any other column are ignored (key groups are computed from the key
  for the savepoint's ``max_parallelism``).

:func:`to_state_table` refuses, with a :class:`ConfigError` naming the operator, the state,
the column and an example row: a missing column, a type that is not the state's (values are
cast only within one family of types: integers, floats and decimals among each other, strings,
binaries, timestamps, ...; a value that does not fit is refused), nulls where the state has
none (keys, values, list elements, map values), empty lists and maps (no entry), duplicate
(key, namespace) pairs (timers: duplicate (key, namespace, timestamp)), an expiry on a state
without TTL.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.compute import pc
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import ConfigError, SerializationError
from statelog.keys.encoding import decode_key, encode_key
from statelog.materialization.table_schema import table_schema
from statelog.readers.schema import render
from statelog.readers.state import key_groups
from statelog.types import PICKLE, arrow_type


@dataclass(frozen=True)
class Where:
    """The operator and state a table is written for (the context of every message)."""

    operator: str
    state: str

    def error(self, column: str, problem: str, row: int | None = None, example: str = "") -> ConfigError:
        at = f" (row {row}{': ' + example if example else ''})" if row is not None else ""
        return ConfigError(f"operator {self.operator!r}, state {self.state!r}, column {column!r}: {problem}{at}")


def _family(t: pa.DataType) -> Any:
    pt = pa.types
    if pt.is_integer(t) or pt.is_floating(t) or pt.is_decimal(t):
        return "number"
    if pt.is_string(t) or pt.is_large_string(t):
        return "string"
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
        return "binary"
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return ("list", _family(t.value_type))
    if pt.is_map(t):
        return ("map", _family(t.key_type), _family(t.item_type))
    if pt.is_struct(t):
        return ("struct", tuple((t.field(i).name, _family(t.field(i).type)) for i in range(t.num_fields)))
    if pt.is_timestamp(t):
        return "timestamp"
    if pt.is_date(t):
        return "date"
    return str(t)


def cast_column(arr: pa.ChunkedArray | pa.Array, target: pa.DataType, where: Where, column: str) -> pa.Array:
    """``arr`` as ``target`` (one family of types; a value that does not fit is refused)."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if arr.type == target:
        return arr
    if not pa.types.is_null(arr.type) and _family(arr.type) != _family(target):
        raise where.error(column, f"has type {arr.type}, the state holds {target}; cast the column explicitly")
    try:
        return arr.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        for i, v in enumerate(arr.to_pylist()):
            try:
                pa.array([v], arr.type).cast(target, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise where.error(column, f"value {v!r} does not fit the state's type {target}", i) from None
        raise where.error(column, f"cannot be cast to the state's type {target}: {e}") from None


def _first_null(arr: pa.Array) -> int | None:
    if arr.null_count == 0:
        return None
    return int(pc.index(arr.is_null(), True).as_py())


def encoded(table: pa.Table, bytes_col: str, col: str, where: Where, default: bytes | None) -> pa.Array:
    """The encoded keys (namespaces) of the rows: the ``*_bytes`` column, else ``col`` encoded."""
    names = table.column_names
    if bytes_col in names:
        arr = cast_column(table.column(bytes_col), pa.binary(), where, bytes_col)
        i = _first_null(arr)
        if i is not None:
            raise where.error(bytes_col, "null (the encoded key of None is b'\\x00')", i)
        for i, b in enumerate(arr.to_pylist()):
            try:
                decode_key(b)
            except Exception as e:  # CorruptionError and what a bad custom type raises
                raise where.error(bytes_col, f"{b!r} is not an encoded key ({e})", i) from None
        return arr
    if col not in names:
        if default is None:
            raise where.error(f"{col}/{bytes_col}", f"missing: give {bytes_col} (encoded) or {col} (typed)")
        return pa.array([default] * table.num_rows, pa.binary())
    column = table.column(col)
    if pa.types.is_integer(column.type) and column.null_count == 0 and not pa.types.is_uint64(column.type):
        return _int_keys(column)
    out = []
    for i, v in enumerate(column.to_pylist()):
        if v is None and default is None:
            raise where.error(col, "null key: keys are never null (write the key None as key_bytes b'\\x00')", i)
        try:
            out.append(encode_key(v))
        except SerializationError as e:
            raise where.error(col, str(e), i) from None
    return pa.array(out, pa.binary())


def _int_keys(column: pa.ChunkedArray) -> pa.Array:
    """``encode_key`` of int64-range integers in bulk (docs/format.md 3.1: tag 0x03, then
    ``v + 2**63`` as 8 bytes big-endian)."""
    v = column.combine_chunks().cast(pa.int64()).to_numpy(zero_copy_only=False)
    out = np.empty((len(v), 9), dtype=np.uint8)
    out[:, 0] = 0x03
    out[:, 1:] = (v.astype(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").view(np.uint8).reshape(-1, 8)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(9), len(v), [None, pa.py_buffer(out.tobytes())]).cast(
        pa.binary())


def to_state_table(info: StateInfo, data: pa.Table, max_parallelism: int, where: Where) -> pa.Table:
    """The state table (docs/format.md section 9) of view-shaped rows ``data``, sorted, checked."""
    keys = encoded(data, "key_bytes", "key", where, None)
    nss = encoded(data, "namespace_bytes", "namespace", where, b"\x00")
    kgs = key_groups(keys.to_pylist(), max_parallelism) if data.num_rows else pa.array([], pa.int32())
    schema = table_schema(info)
    if info.name in TIMER_STATES:
        ts = _required(data, "timestamp", where)
        ts = cast_column(ts, pa.int64(), where, "timestamp")
        i = _first_null(ts)
        if i is not None:
            raise where.error("timestamp", "null timer timestamp", i)
        cols = [ts]
    else:
        cols = list(_entries(info, data, where))
    table = pa.Table.from_arrays([kgs, keys, nss, *[c.cast(f.type) for c, f in zip(cols, list(schema)[3:], strict=True)]],
                                 schema=schema)
    sort = [("key_group", "ascending"), ("key", "ascending"), ("namespace", "ascending")]
    if info.name in TIMER_STATES:
        sort.append(("timestamp", "ascending"))
    order = pc.sort_indices(table, sort_keys=sort)
    table = table.take(order)
    _check_unique(table, order, where, info.name in TIMER_STATES)
    return table


def _required(data: pa.Table, name: str, where: Where) -> pa.ChunkedArray:
    if name not in data.column_names:
        raise where.error(name, f"missing (columns given: {', '.join(data.column_names)})")
    return data.column(name)


def _check_unique(table: pa.Table, order: pa.Array, where: Where, timers: bool) -> None:
    n = table.num_rows
    if n < 2:
        return
    names = ["key", "namespace", *(["timestamp"] if timers else [])]
    same = None
    for name in names:
        c = table.column(name).combine_chunks()
        eq = pc.equal(c.slice(1), c.slice(0, n - 1))
        same = eq if same is None else pc.and_(same, eq)
    assert same is not None
    if not pc.any(same).as_py():
        return
    j = int(pc.index(same, True).as_py())
    a, b = sorted((order[j].as_py(), order[j + 1].as_py()))
    key = decode_key(table.column("key")[j].as_py())
    ns = decode_key(table.column("namespace")[j].as_py())
    what = "timer" if timers else "key"
    raise where.error("key", f"duplicate {what} {key!r} in namespace {ns!r} (rows {a} and {b}); each "
                      f"(key, namespace{', timestamp' if timers else ''}) must appear once", a,
                      f"key={key!r}, namespace={ns!r}")


def _entries(info: StateInfo, data: pa.Table, where: Where) -> tuple[pa.Array, pa.Array]:
    pickled = info.value_type is PICKLE or (info.kind is StateKind.MAP and info.user_key_type is PICKLE)
    exp_col = data.column("expires_ms") if "expires_ms" in data.column_names else None
    if exp_col is not None and info.ttl is None and exp_col.null_count < len(exp_col):
        i = _first_null(pc.invert(exp_col.combine_chunks().is_null()))
        raise where.error("expires_ms", "the state has no TTL, so entries have no expiry; drop the column or "
                          "declare the state's ttl", i)
    if pickled:
        return _pickled(info, _required(data, "value_pickle", where), exp_col, where)
    value = _required(data, "value", where)
    if info.kind is StateKind.LIST:
        return _list(info, value, exp_col, where)
    if info.kind is StateKind.MAP:
        return _map(info, value, exp_col, where)
    v = cast_column(value, arrow_type(info.value_type), where, "value")
    i = _first_null(v)
    if i is not None:
        raise where.error("value", "null value (a state holds no null value: leave the row out)", i)
    exps = pa.nulls(len(v), pa.int64()) if exp_col is None else cast_column(exp_col, pa.int64(), where, "expires_ms")
    return v, exps


def _list(info: StateInfo, value: pa.ChunkedArray, exp_col: pa.ChunkedArray | None,
          where: Where) -> tuple[pa.Array, pa.Array]:
    v = cast_column(value, pa.list_(arrow_type(info.value_type)), where, "value")
    _check_nested(v, where, "list")
    if exp_col is None:
        return v, pa.nulls(len(v), pa.list_(pa.int64()))
    exps = cast_column(exp_col, pa.list_(pa.int64()), where, "expires_ms")
    lens, elens = pc.list_value_length(v), pc.list_value_length(exps)
    bad = pc.and_(pc.is_valid(elens), pc.not_equal(lens, elens))
    if pc.any(bad).as_py():
        i = int(pc.index(bad, True).as_py())
        raise where.error("expires_ms", "has another length than value (one expiry per element)", i)
    return v, exps


def _check_nested(v: pa.Array, where: Where, what: str) -> None:
    i = _first_null(v)
    if i is not None:
        raise where.error("value", f"null {what} (a state holds no null entry: leave the row out)", i)
    lens = pc.list_value_length(v) if what == "list" else pc.list_value_length(v.cast(
        pa.list_(pa.struct([v.type.key_field, v.type.item_field]))))
    empty = pc.equal(lens, 0)
    if pc.any(empty).as_py():
        raise where.error("value", f"empty {what} (an empty {what} is no entry: leave the row out)",
                          int(pc.index(empty, True).as_py()))
    items = v.values if what == "list" else v.items
    if items.null_count:
        j = int(pc.index(items.is_null(), True).as_py())
        row = int(pc.index(pc.greater(pc.cumulative_sum(lens), j), True).as_py())
        raise where.error("value", f"null {'element' if what == 'list' else 'map value'}: {what} "
                          f"{'elements' if what == 'list' else 'values'} are never null", row)


def _map(info: StateInfo, value: pa.ChunkedArray, exp_col: pa.ChunkedArray | None,
         where: Where) -> tuple[pa.Array, pa.Array]:
    assert info.user_key_type is not None
    v = cast_column(value, pa.map_(arrow_type(info.user_key_type), arrow_type(info.value_type)), where, "value")
    _check_nested(v, where, "map")
    maps = v.to_pylist()
    for i, items in enumerate(maps):
        ks = [k for k, _ in items]
        if len(set(map(_hashable, ks))) != len(ks):
            raise where.error("value", "a map key appears twice in one map", i)
    if exp_col is None:
        return v, pa.nulls(len(v), pa.list_(pa.int64()))
    exps = exp_col.to_pylist()
    return v, pa.array([_map_expiry(items, e, where, i, lambda k: k) for i, (items, e) in
                        enumerate(zip(maps, exps, strict=True))], pa.list_(pa.int64()))


def _hashable(k: Any) -> Any:
    return repr(k) if isinstance(k, (list, dict)) else k


def _map_expiry(items: list[tuple[Any, Any]], e: Any, where: Where, i: int, shown: Any) -> list[int] | None:
    """Per map entry in the order of ``items``, the expiry from the view's ``map<U, long>``."""
    if e is None:
        return None
    got = dict(e) if not isinstance(e, dict) else e
    out = []
    for k, _ in items:
        x = got.get(shown(k))
        if x is None:
            raise where.error("expires_ms", f"has no expiry for map key {k!r}", i)
        out.append(int(x))
    return out


def _pickled(info: StateInfo, col: pa.ChunkedArray, exp_col: pa.ChunkedArray | None,
             where: Where) -> tuple[pa.Array, pa.Array]:
    """Pickled types: ``value_pickle`` holds ``pickle.dumps`` of the whole entry."""
    blobs = cast_column(col, pa.binary(), where, "value_pickle").to_pylist()
    exps = exp_col.to_pylist() if exp_col is not None else [None] * len(blobs)
    schema = table_schema(info)
    values: list[Any] = []
    out_exp: list[Any] = []
    for i, (b, e) in enumerate(zip(blobs, exps, strict=True)):
        if b is None:
            raise where.error("value_pickle", "null (a state holds no null entry: leave the row out)", i)
        try:
            v = pickle.loads(b)
        except Exception as err:  # what unpickling raises is open-ended
            raise where.error("value_pickle", f"not a pickle: {type(err).__name__}: {err}", i) from None
        if info.kind is StateKind.LIST:
            if not isinstance(v, list) or not v or any(x is None for x in v):
                raise where.error("value_pickle", f"{type(v).__name__} {v!r:.80}: a list state's entry is a "
                                  "non-empty list without None elements", i)
            values.append([_dump(x) for x in v] if info.value_type is PICKLE else v)
            out_exp.append(None if e is None else [int(x) for x in e])
        elif info.kind is StateKind.MAP:
            if not isinstance(v, dict) or not v or any(x is None for x in v.values()):
                raise where.error("value_pickle", f"{type(v).__name__} {v!r:.80}: a map state's entry is a "
                                  "non-empty dict without None values", i)
            ukp, vp = info.user_key_type is PICKLE, info.value_type is PICKLE
            values.append([(_dump(k) if ukp else k, _dump(x) if vp else x) for k, x in v.items()])
            shown = render if ukp else (lambda k: k)
            out_exp.append(_map_expiry(list(v.items()), e, where, i, shown))
        else:
            if v is None:
                raise where.error("value_pickle", "holds None (a state holds no null value: leave the row out)", i)
            values.append(b)
            out_exp.append(None if e is None else int(e))
    try:
        arr = pa.array(values, schema.field("value").type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as err:
        raise where.error("value_pickle", f"an entry does not fit the state's types: {err}") from None
    return arr, pa.array(out_exp, schema.field("expires_ms").type)


def _dump(v: Any) -> bytes:
    return pickle.dumps(v, protocol=5)
