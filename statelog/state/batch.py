"""The batch calls of the keyed state kinds: a whole column of keys per call.

``ValueState.get_many/put_many/delete_many``, ``ReducingState``/``AggregatingState.add_many``
and ``ListState.add_many`` (methods of :mod:`statelog.state.kinds` and
:mod:`statelog.state.containers`) call the functions here. A call takes its keys as an Arrow
array or a Python sequence, in the state's current namespace:

* the keys are encoded and their key groups computed a column at a time
  (:mod:`statelog.keys.batch`, the hash of the per-record path), checked against the
  backend's key groups (:class:`~statelog.errors.KeyGroupError` as for a single key), their
  key groups loaded first during an on-demand restore, and with the disk-backed working set
  read in one batched read (``ctx.batch_keys``, set by the backend);
* the entries are read and written with ``map``/``dict.update`` over the table (C loops, no
  Python function per key) and the values computed with pyarrow compute; the int sums,
  counts, minima and maxima of a state without TTL whose table is a dict or an
  ``IntTable`` are folded in one C pass instead
  (:func:`~statelog.state.batch_reductions.fold_into_dict`: each key looked up once and set
  while its entry is in the cache, the new values in a numpy buffer that becomes the
  changelog's value column; into an ``IntTable`` the keys go in key-group order, the
  flusher's order), which leaves to this Arrow path, unchanged, any batch with a stored
  value or a result it does not handle (so the errors are this path's);
* the change records of the call go to the state's changelog stream as one block part of
  Arrow columns (:meth:`ChangelogStream.append_columns
  <statelog.changelog.stream.ChangelogStream.append_columns>`), the same records, in the same
  block schema, as the per-record calls would write for the same changes.

What does not vectorize (a reduce function with no :class:`BatchReduction`, ``None``
values, a pickled value type, a list state with TTL) runs the per-record method key by key
through the backend's key setter, with the same result; the current key is restored after.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import compress, repeat
from typing import Any

import numpy as np
import pyarrow as pa

from statelog._ext import IntTable
from statelog.changelog.ops import Op
from statelog.compute import pc
from statelog.errors import SerializationError, StateTypeError
from statelog.keys.batch import as_key_array, encode_keys, int64_keys
from statelog.state.batch_reductions import (
    COUNT,
    MAX,
    MIN,
    SUM,
    BatchReduction,
    CountAggregate,
    SumAggregate,
    batch_reduction_of,
    fold_into_dict,
    group_numpy,
)
from statelog.state.context import NO_KEY, NO_KEY_INFO
from statelog.types import PICKLE

# an absent entry, as a TTL entry ``[value, expires]`` that is expired at any time
_ABSENT = (None, -(1 << 62))
_FIRST = operator.itemgetter(0)
_PUT, _DELETE, _LIST_APPEND = Op.PUT.value, Op.DELETE.value, Op.LIST_APPEND.value
_SECOND = operator.itemgetter(1)


# -- helpers -------------------------------------------------------------------------------------


def _values_array(state: Any, values: Any, n: int) -> pa.Array:
    """``values`` as an Arrow array of the state's value type (checked like single values)."""
    vt = state.descriptor.value_type
    try:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        arr = values if isinstance(values, pa.Array) else pa.array(values if isinstance(values, list) else list(values), vt)
        if arr.type != vt:
            arr = arr.cast(vt)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise StateTypeError(
            f"state {state.name!r}: the batch's values do not fit the declared type {vt}: {e}; pass "
            "values of that type (an Arrow array or a sequence of Python values)"
        ) from None
    if len(arr) != n:
        raise SerializationError(f"state {state.name!r}: {n} keys but {len(arr)} values; pass one value per key")
    return arr


def _table(state: Any, pykeys: list[Any] | np.ndarray) -> Any:
    """The table of the current namespace that ``pykeys`` can be read and written through (with
    the disk-backed working set the resident dict when the batch's keys are all resident; its
    batch keys are always a list, ``batch_keys``)."""
    table = state._store.replay_table_for(state._table_for)(state._nsb)
    if_resident = getattr(table, "if_resident", None)
    if if_resident is not None:
        return if_resident(pykeys) or table
    return table


def _keys(state: Any, keys: Any, int_column: bool = False) -> tuple[Any, pa.Array, np.ndarray]:
    return state._ctx.batch_keys(keys, int_column)


def _emit(state: Any, op: int, kbs: pa.Array, kgs: np.ndarray, values: Any, expires: Any = None) -> None:
    stream = state._stream
    n = len(kbs)
    if stream is None or n == 0:
        return
    kg_arr = pa.array(kgs, pa.uint16())
    ns = [state._nsb] * n
    ops = [op] * n
    if state._narrow:
        cols: list[Any] = [kbs, kg_arr, ns, ops, values]
    else:
        exp = [None] * n if expires is None else pa.array(np.full(n, expires, np.int64))
        cols = [kbs, kg_arr, ns, ops, [None] * n, values, exp]
    stream.append_columns(cols, (int(kgs.min()), int(kgs.max())))


def _store_values(state: Any, table: Any, pykeys: list[Any], pyvals: list[Any]) -> int | None:
    """Write values (plain, or ``[value, expires]`` with TTL); returns the expiry or ``None``."""
    if not state._ttl:
        table.update(zip(pykeys, pyvals, strict=True))
        return None
    exp = state._now() + state._ttl
    table.update(zip(pykeys, map(list, zip(pyvals, repeat(exp))), strict=True))
    return exp


def _take(pylist: list[Any], idx: np.ndarray) -> list[Any]:
    if len(idx) == 0:
        return []
    if len(idx) == 1:
        return [pylist[int(idx[0])]]
    return list(operator.itemgetter(*idx.tolist())(pylist))


def _current(state: Any, table: Any, pykeys: list[Any], vt: Any) -> tuple[pa.Array, np.ndarray | None]:
    """The stored values of ``pykeys`` (null where absent or expired), and with TTL the mask
    of the live ones."""
    if not state._ttl:
        return pa.array(list(map(table.get, pykeys)), vt), None
    ents = list(map(table.get, pykeys, repeat(_ABSENT)))
    exps = np.fromiter(map(_SECOND, ents), np.int64, len(ents))
    live = exps > state._now()
    vals = pa.array(list(map(_FIRST, ents)), vt)
    return pc.if_else(pa.array(live), vals, pa.nulls(len(vals), vt)), live


def per_record(state: Any, keys: Any, values: Any, call: Callable[..., None]) -> None:
    """Run ``call(value)`` (or ``call()`` without values) with each key current in turn, then
    make the key current before the call current again."""
    ctx = state._ctx
    key, info = ctx.key, ctx.key_info
    arr = as_key_array(keys)
    pykeys = arr.to_pylist() if arr is not None else list(keys)
    if values is not None:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        pyvals = values.to_pylist() if isinstance(values, pa.Array) else list(values)
        if len(pyvals) != len(pykeys):
            raise SerializationError(
                f"state {state.name!r}: {len(pykeys)} keys but {len(pyvals)} values; pass one value per key")
    set_key = ctx.set_current_key
    try:
        if values is None:
            for k in pykeys:
                set_key(k)
                call()
        else:
            for k, v in zip(pykeys, pyvals, strict=True):
                set_key(k)
                call(v)
    finally:
        if key is NO_KEY:
            ctx.key, ctx.key_info = NO_KEY, NO_KEY_INFO
        else:
            set_key(key)
    _ = info


# -- value states --------------------------------------------------------------------------------


def get_many(state: Any, keys: Any) -> pa.Array:
    vt = state.descriptor.value_type
    if vt is PICKLE:
        raise SerializationError(
            f"state {state.name!r} holds pickled values, which get_many cannot return as an Arrow "
            "array; read them with value() per key, or declare an Arrow value type")
    pykeys, kbs, kgs = _keys(state, keys)
    table = _table(state, pykeys)
    vals, live = _current(state, table, pykeys, vt)
    if live is not None and state._ttl_on_read and live.any():
        idx = np.flatnonzero(live)
        lkeys = _take(pykeys, idx)
        lvals = vals.take(pa.array(idx))
        exp = _store_values(state, table, lkeys, lvals.to_pylist())
        _emit(state, _PUT, kbs.take(pa.array(idx)), kgs[idx], lvals, exp)
    if state._default is not None:
        vals = pc.fill_null(vals, pa.scalar(state._default, vt))
    return vals


def put_many(state: Any, keys: Any, values: Any) -> None:
    vt = state.descriptor.value_type
    if vt is PICKLE:
        return per_record(state, keys, values, state.update)
    arr = as_key_array(keys)
    n = len(arr) if arr is not None else len(keys)
    vals = _values_array(state, values, n)
    if vals.null_count:  # None clears
        return per_record(state, keys, vals, state.update)
    pykeys, kbs, kgs = _keys(state, keys)
    exp = _store_values(state, _table(state, pykeys), pykeys, _pylist(vals))
    _emit(state, _PUT, kbs, kgs, vals, exp)
    return None


def delete_many(state: Any, keys: Any) -> None:
    pykeys, kbs, kgs = _keys(state, keys)
    table = _table(state, pykeys)
    missing = object()
    popped = list(map(table.pop, pykeys, repeat(missing)))
    hit = np.fromiter(map(operator.is_not, popped, repeat(missing)), bool, len(popped))
    if hit.any():
        idx = pa.array(np.flatnonzero(hit))
        _emit(state, _DELETE, kbs.take(idx), kgs[hit], pa.nulls(len(idx), _null_type(state)))


def _null_type(state: Any) -> Any:
    vt = state.descriptor.value_type
    return pa.binary() if vt is PICKLE else vt


def _group(keys: Any, vals: pa.Array, aggregation: str) -> tuple[Any, pa.Array]:
    """The distinct keys of a batch (an Arrow array, in key order; mixed keys in first-seen
    order) and the values of each
    folded with ``aggregation``."""
    arr = as_key_array(keys)
    fast = group_numpy(arr, vals, aggregation)
    if fast is not None:
        return fast
    if arr is not None and not (pa.types.is_integer(arr.type) or pa.types.is_string(arr.type)):
        keys, arr = arr.to_pylist(), None  # e.g. floats: 0.0 and -0.0 are one key
    if arr is None:
        pykeys = keys if isinstance(keys, list) else list(keys)
        try:
            arr = pa.array(pykeys)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            arr = None
        if arr is not None and not (pa.types.is_integer(arr.type) or pa.types.is_string(arr.type)):
            arr = None
        if arr is None:  # mixed or other keys: group by their encoding
            _, kbs = encode_keys(pykeys)
            t = pa.table({"k": kbs, "i": pa.array(np.arange(len(pykeys))), "v": vals})
            g = t.group_by("k", use_threads=False).aggregate([("i", "min"), ("v", aggregation)])
            return _take(pykeys, g.column("i_min").to_numpy()), g.column(f"v_{aggregation}").combine_chunks()
    t = pa.table({"k": arr, "v": vals})
    g = t.group_by("k", use_threads=False).aggregate([("v", aggregation)])
    # in key order: the tables' dicts are read and written in that order, which keeps the
    # entries (and key objects) that new keys add next to each other in memory (measured
    # 4x fewer ns per dict access at 10^5 keys than in the batch's order)
    g = g.take(pc.sort_indices(g.column("k")))
    return g.column("k").combine_chunks(), g.column(f"v_{aggregation}").combine_chunks()


def add_many(state: Any, red: BatchReduction | None, keys: Any, values: Any, call: Callable[[Any], None]) -> None:
    """``add_many`` of a reducing or aggregating state (``call`` is its ``add``)."""
    vt = state.descriptor.value_type
    arr = as_key_array(keys)
    n = len(arr) if arr is not None else len(keys)
    if red is None or vt is PICKLE:
        return per_record(state, keys, values, call)
    if red is COUNT:
        vals = pa.repeat(pa.scalar(1, pa.int8()), n) if values is None else _count_values(values, n, state)
    else:
        vals = _values_array(state, values, n)
        if vals.null_count:
            return per_record(state, keys, vals, call)
    if n == 0:
        return None
    ukeys, partial = _group(keys, vals, red.aggregation)
    # (the keys of an int column as int64s: the fold in C makes each int as it needs it)
    pykeys, kbs, kgs = _keys(state, ukeys, int_column=True)
    table = _table(state, pykeys)
    try:
        partial = partial.cast(vt)
        if type(table) is IntTable and isinstance(pykeys, np.ndarray) and state._stream is not None:
            pykeys, kbs, kgs, partial = _by_key_group(pykeys, kbs, kgs, partial)
        # in C when it applies (it stores the new values), else with Arrow
        folded = None if state._ttl else fold_into_dict(table, pykeys, red, partial, vt)
        if folded is None and isinstance(pykeys, np.ndarray):
            pykeys = pykeys.tolist()
        new = folded if folded is not None else _fold(state, red, table, pykeys, partial, vt)
    except (pa.ArrowInvalid, OverflowError) as e:
        raise StateTypeError(f"state {state.name!r}: the batch's result does not fit the declared type {vt}: {e}") from None
    exp = None if folded is not None else _store_values(state, table, pykeys, _pylist(new))
    _emit(state, _PUT, kbs, kgs, new, exp)
    return None


def _by_key_group(pykeys: np.ndarray, kbs: pa.Array, kgs: np.ndarray, partial: pa.Array) -> tuple[Any, ...]:
    """A batch's distinct keys (and their key bytes, key groups and values) in key-group
    order, for a fold into an ``IntTable``, whose slots no key order makes adjacent: the
    flusher sorts a segment's records by key group (docs/format.md 4.2), and parts already in
    that order make its gather a merge of sequential runs instead of a random read per
    record."""
    order = np.argsort(kgs, kind="stable")  # a radix sort for 16-bit key groups
    ints = pykeys[order]
    # the key bytes of an int column's keys are int64_keys of the ints: encoded again in
    # the new order, 8x faster than gathering a binary column
    return ints, int64_keys(ints), kgs[order], partial.take(pa.array(order))


def _fold(state: Any, red: BatchReduction, table: Any, pykeys: list[Any], partial: pa.Array, vt: Any) -> pa.Array:
    """The stored values of ``pykeys`` folded with ``partial`` by ``red`` (the reference path)."""
    if red.identity is not None and not state._ttl and pa.types.is_integer(vt):
        old = pa.array(np.fromiter(map(table.get, pykeys, repeat(red.identity)), np.int64, len(pykeys)))
        return red.combine(old, partial).cast(vt)
    cur, _ = _current(state, table, pykeys, vt)
    return pc.coalesce(red.combine(cur, partial), partial).cast(vt)


def _pylist(arr: pa.Array) -> list[Any]:
    """Python values of an Arrow array (through numpy for numbers without nulls: faster)."""
    if arr.null_count == 0 and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return arr.to_numpy().tolist()
    return arr.to_pylist()


def _count_values(values: Any, n: int, state: Any) -> pa.Array:
    """One per value, ``None`` included (the per-record ``add`` counts every call)."""
    if len(values) != n:
        raise SerializationError(f"state {state.name!r}: {n} keys but {len(values)} values; pass one value per key")
    return pa.repeat(pa.scalar(1, pa.int8()), n)


# -- list state ----------------------------------------------------------------------------------


def list_add_many(state: Any, keys: Any, values: Any) -> None:
    vt = state.descriptor.value_type
    arr = as_key_array(keys)
    n = len(arr) if arr is not None else len(keys)
    if state._ttl or vt is PICKLE:
        return per_record(state, keys, values, state.add)
    vals = _values_array(state, values, n)
    if vals.null_count:
        return per_record(state, keys, vals, state.add)  # (raises as add(None) does)
    if n == 0:
        return None
    ukeys, lists = _group(keys, vals, "list")
    pykeys, kbs, kgs = _keys(state, ukeys)
    table = _table(state, pykeys)
    pylists = lists.to_pylist()
    cur = list(map(table.get, pykeys))
    has = np.fromiter(map(operator.is_not, cur, repeat(None)), bool, len(cur))
    # extend the stored lists in place (copies of the new elements: the records keep theirs)
    list(map(list.extend, compress(cur, has), compress(pylists, has)))
    if type(table) is not dict:
        # a disk-backed view may have written an entry back and dropped it after handing it
        # out (reading the batch's later keys made room): set every list, extended or new
        table.update(zip(pykeys, [c if c is not None else list(p) for c, p in zip(cur, pylists, strict=True)],
                         strict=True))
        return _emit(state, _LIST_APPEND, kbs, kgs, pylists)
    new = ~has
    if new.any():
        table.update(zip(compress(pykeys, new), map(list, compress(pylists, new)), strict=False))
    _emit(state, _LIST_APPEND, kbs, kgs, pylists)
    return None


__all__ = ["COUNT", "MAX", "MIN", "SUM", "BatchReduction", "CountAggregate", "SumAggregate", "batch_reduction_of"]
