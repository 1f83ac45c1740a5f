"""The reductions that ``add_many`` vectorizes (:class:`BatchReduction`), the aggregate
functions that have one, the grouping of a batch's int keys in numpy, and the fold of a
batch's int sums, counts, minima and maxima into a table in C (:func:`fold_into_dict`:
``add_into`` of ``statelog/_ext/fastpath.c`` for a dict, of ``statelog/_ext/inttable.c`` for
an ``IntTable``); :mod:`statelog.state.batch` uses them."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statelog import _ext
from statelog._ext import IntTable, inttable, plain_table
from statelog.arrays import integer_numpy, numpy_integers
from statelog.compute import pc


@dataclass(frozen=True)
class BatchReduction:
    """How ``add_many`` folds a batch into a reducing or aggregating state.

    ``aggregation`` is a pyarrow hash aggregation (``"sum"``, ``"count"``, ``"min"``,
    ``"max"``, ``"product"``, ...) that folds the values of each key within the batch;
    ``combine(stored, partial)`` merges two Arrow arrays element-wise (a pyarrow compute
    function such as ``pc.add_checked``). The per-record function must agree with it: for a
    reducing state ``reduce_fn(reduce_fn(a, b), c) == combine(a, aggregation([b, c]))``; for
    an aggregating state the accumulator is the stored value, ``create_accumulator()`` is
    the identity of ``combine`` and ``add(v, acc) == combine(acc, aggregation([v]))``.

    Plug one in by setting it as the ``batch_reduction`` attribute of a reduce function or
    an aggregate function object; ``operator.add``, ``min`` and ``max`` as ``reduce_fn`` are
    recognized as :data:`SUM`, :data:`MIN` and :data:`MAX`.
    """

    aggregation: str
    combine: Callable[[Any, Any], Any]
    identity: Any = None  # the value an absent entry counts as, if any (0 for sum and count)


# the compute functions are looked up at the call: defining these imports no pyarrow.compute
def _add_checked(a: Any, b: Any) -> Any:
    return pc.add_checked(a, b)


def _min_element_wise(a: Any, b: Any) -> Any:
    return pc.min_element_wise(a, b)


def _max_element_wise(a: Any, b: Any) -> Any:
    return pc.max_element_wise(a, b)


SUM = BatchReduction("sum", _add_checked, 0)
COUNT = BatchReduction("count", _add_checked, 0)
MIN = BatchReduction("min", _min_element_wise)
MAX = BatchReduction("max", _max_element_wise)
_KNOWN: dict[Any, BatchReduction] = {operator.add: SUM, min: MIN, max: MAX}

# The fold of a batch into a dict in C (statelog/_ext/fastpath.c add_into), when it was
# built and STATELOG_PURE_PYTHON is not set; else None (the Arrow path of add_many).
_fastpath = _ext.load("fastpath")
_add_into = getattr(_fastpath, "add_into", None)
_radix_sort = getattr(_fastpath, "radix_sort", None)
_RADIX_MIN = 1 << 10  # smaller batches: numpy's sort (the radix sort's passes cost more)
# the integer types whose values are all int64s: numpy dtype, lowest and highest value
_INT_TYPES = {t: (np.dtype(t.to_pandas_dtype()), int(np.iinfo(t.to_pandas_dtype()).min),
                  int(np.iinfo(t.to_pandas_dtype()).max))
              for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32())}


def batch_reduction_of(fn: Any) -> BatchReduction | None:
    """The :class:`BatchReduction` of a reduce function or aggregate function, if any."""
    red = getattr(fn, "batch_reduction", None)
    if isinstance(red, BatchReduction):
        return red
    try:
        return _KNOWN.get(fn)
    except TypeError:  # unhashable
        return None


class CountAggregate:
    """An aggregate function counting the values added per key (an int64 accumulator);
    ``add_many`` counts a batch with :data:`COUNT`."""

    batch_reduction = COUNT

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + 1

    def get_result(self, acc: int) -> int:
        return acc


class SumAggregate:
    """An aggregate function summing the values added per key; ``add_many`` uses :data:`SUM`."""

    batch_reduction = SUM

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: Any) -> Any:
        return acc + value

    def get_result(self, acc: Any) -> Any:
        return acc


def fold_into_dict(
    table: Any, pykeys: list[Any] | np.ndarray, red: BatchReduction, partial: pa.Array, vt: Any
) -> pa.Array | None:
    """``table[k] = red(table.get(k), p)`` for each distinct key ``k`` of ``pykeys`` (a list, or
    the int64s of an int column) and value
    ``p`` of ``partial`` (the batch's fold per key, of the declared type ``vt``), returning the
    new values as an Arrow array of ``vt``: one pass in C over the keys, each looked up once
    and set while its entry is still in the cache, the results written to a numpy buffer (no
    Python list). For :data:`SUM` and :data:`COUNT` an absent entry counts as 0, for
    :data:`MIN` and :data:`MAX` it takes ``p``.

    ``None`` with ``table`` unchanged when this does not apply: the extension is not built
    (or STATELOG_PURE_PYTHON is set), ``table`` is neither a dict nor an ``IntTable`` (the
    disk-backed working set's view of keys that are not all resident), keys given as a list
    to an ``IntTable`` in int mode, another reduction, a value type other than the
    integer types within int64, a stored value that is not an int of ``vt``, or a result
    outside ``vt`` (int64 overflow included). The caller's Arrow path then folds the batch,
    and raises its errors."""
    if _add_into is None:
        return None
    table = plain_table(table)  # (an IntTable in dict mode folds through its dict)
    if type(table) is IntTable:
        if not isinstance(pykeys, np.ndarray):
            return None
    elif type(table) is not dict:
        return None
    if isinstance(pykeys, np.ndarray):
        pykeys = np.ascontiguousarray(pykeys, np.int64)
    fold = _fold_code(red)
    kind = _INT_TYPES.get(vt)
    if fold is None or kind is None:
        return None
    dtype, lo, hi = kind
    p = np.ascontiguousarray(integer_numpy(partial), np.int64)
    out = np.empty(len(p), np.int64)
    add_into = inttable.add_into if type(table) is IntTable else _add_into
    if not add_into(table, pykeys, p, out, fold, lo, hi):
        return None
    return numpy_integers(out if dtype == np.int64 else out.astype(dtype))


def _fold_code(red: BatchReduction) -> int | None:
    if red is SUM or red is COUNT:
        return _fastpath.FOLD_SUM  # type: ignore[union-attr]
    if red is MIN:
        return _fastpath.FOLD_MIN  # type: ignore[union-attr]
    if red is MAX:
        return _fastpath.FOLD_MAX  # type: ignore[union-attr]
    return None


_REDUCEAT = {"sum": np.add, "min": np.minimum, "max": np.maximum}


def group_numpy(arr: pa.Array | None, vals: pa.Array, aggregation: str) -> tuple[pa.Array, pa.Array] | None:
    """:func:`_group` of int64 keys and numbers without nulls by a sort in numpy (a third of
    the time of Arrow's hash aggregation here), or ``None`` when it does not apply (a sum that
    could leave int64 is left to Arrow's checked arithmetic)."""
    if (arr is None or arr.null_count or vals.null_count or not pa.types.is_integer(arr.type)
            or arr.type == pa.uint64() or (aggregation != "count" and aggregation not in _REDUCEAT)):
        return None
    if aggregation != "count" and not (pa.types.is_integer(vals.type) or pa.types.is_floating(vals.type)):
        return None
    k = arr.to_numpy().astype(np.int64, copy=False)
    n = len(k)
    if n == 0:
        return None
    if aggregation == "count":  # the keys alone, sorted (a sort of values: ~4x faster than argsort)
        kmin = int(k.min())
        span = (int(k.max()) - kmin).bit_length()
        if span > 62:
            sk = np.sort(k)
        else:
            sk = k - np.int64(kmin)
            sort_nonnegative(sk, span)
            sk += np.int64(kmin)
        starts = _run_starts(sk)
        return pa.array(sk[starts]), pa.array(np.diff(np.append(starts, n)).astype(np.int64))
    v = vals.to_numpy()
    if aggregation == "sum" and v.dtype.kind in "iu":
        big = int(max(abs(int(v.max())), abs(int(v.min()))))
        if big and big * n >= 1 << 63:
            return None
    packed = _sorted_packed(k, v) if v.dtype.kind in "iu" else None
    if packed is not None:
        sk, sv = packed
    else:
        order = np.argsort(k)  # (order within a key does not matter to these folds)
        sk, sv = k[order], v[order]
    if aggregation == "sum" and sv.dtype.kind in "iu":
        sv = sv.astype(np.int64, copy=False)
    starts = _run_starts(sk)
    return pa.array(sk[starts]), pa.array(_REDUCEAT[aggregation].reduceat(sv, starts))


def sort_nonnegative(a: np.ndarray, bits: int) -> None:
    """Sort int64s in ``[0, 2**bits)`` in place: a radix sort in C (``radix_sort`` of
    statelog/_ext/fastpath.c) for a batch of at least ``_RADIX_MIN``, numpy's sort otherwise."""
    if _radix_sort is not None and len(a) >= _RADIX_MIN and a.dtype == np.int64 and a.flags.c_contiguous:
        _radix_sort(a, bits)
    else:
        a.sort()


def _run_starts(sk: np.ndarray) -> np.ndarray:
    """Where each run of equal keys of the sorted keys ``sk`` starts."""
    return np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))


def _sorted_packed(k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Keys and integer values sorted by key with one sort of values (no argsort: ~4x faster)
    when both fit in one int64, key offset above value offset; else ``None``."""
    kmin, vmin, vmax = int(k.min()), int(v.min()), int(v.max())
    if vmin < -(1 << 62) or vmax >= 1 << 62:
        return None
    kbits, vbits = (int(k.max()) - kmin).bit_length(), (vmax - vmin).bit_length()
    if kbits + vbits > 62:
        return None
    packed = ((k - np.int64(kmin)) << np.int64(vbits)) | (v.astype(np.int64) - np.int64(vmin))
    sort_nonnegative(packed, kbits + vbits)
    return (packed >> np.int64(vbits)) + np.int64(kmin), (packed & np.int64((1 << vbits) - 1)) + np.int64(vmin)


__all__ = ["COUNT", "MAX", "MIN", "SUM", "BatchReduction", "CountAggregate", "SumAggregate", "batch_reduction_of"]
