"""Record layouts of the changelog writer's buffers (in memory only, never persisted).

A :class:`~statelog.changelog.stream.ChangelogStream` buffers the change records of one
state as fixed-width records in a flat list, or, for narrow streams when the C extension
is built, as typed columns in a ``RecordBuffer`` (``statelog/_ext/fastpath.c``). Both
layouts are written with the same block schema (:mod:`statelog.changelog.format`) by
:mod:`statelog.changelog.encoder`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from statelog.types import PICKLE, ValueType, to_arrow

# Record layouts in writer buffers (in memory only). A stream holds the records of one
# state of one subtask attempt, as a flat list of fixed-width records:
#   narrow (value, reducing and aggregating state without TTL; timers):
#       key bytes, key group, namespace bytes, op, value
#   wide (list and map state, any state with TTL):
#       key bytes, key group, namespace bytes, op, user key, value, expiry (ms) or None
C_KEY, C_KG, C_NS, C_OP = range(4)  # common to both layouts
N_VALUE = 4  # narrow layout
W_UKEY, W_VALUE, W_EXPIRES = 4, 5, 6  # wide layout
NARROW_WIDTH = 5
WIDE_WIDTH = 7
# A narrow stream buffers its records as columns when the C extension is built
# (``RecordBuffer`` in ``statelog/_ext/fastpath.c``): key and namespace bytes as Arrow binary,
# key group uint16, op uint8, and the value by kind (these numbers are the C ``VK_*``):
VALUE_OBJECT = 0  # a list of Python values, converted like the flat-list layout
VALUE_INT64 = 1  # int64 + validity bitmap (every integer type; cast to the declared type)
VALUE_FLOAT64 = 2  # float64 + validity bitmap


def buffer_value_kind(value_type: ValueType) -> int:
    """How a columnar record buffer stores the values of a state of ``value_type``."""
    if value_type is PICKLE:
        return VALUE_OBJECT
    if pa.types.is_integer(value_type):
        return VALUE_INT64
    if pa.types.is_float64(value_type):
        return VALUE_FLOAT64
    return VALUE_OBJECT


def narrow_columns(chunk: tuple, value_type: ValueType) -> tuple[list[Any], int, int]:
    """The narrow-layout columns of records taken from a columnar buffer (``RecordBuffer.take()``).

    Returns ``([key, key group, namespace, op, value], kg_min, kg_max)``: Arrow arrays built on
    the taken bytes without per-record work; the value column is a list of Python values for
    ``VALUE_OBJECT``. Values the C buffer could not store typed (its overflow list, e.g. an int
    in a float64 state) make the value column go through :func:`to_arrow` like the flat-list
    layout.
    """
    n, koff, kdata, kgs, noff, ndata, ops, vals, validity, nulls, overflow, kg_min, kg_max = chunk
    buf = pa.py_buffer
    key = pa.Array.from_buffers(pa.binary(), n, [None, buf(koff), buf(kdata)], null_count=0)
    kg = pa.Array.from_buffers(pa.uint16(), n, [None, buf(kgs)], null_count=0)
    ns = pa.Array.from_buffers(pa.binary(), n, [None, buf(noff), buf(ndata)], null_count=0)
    op = pa.Array.from_buffers(pa.uint8(), n, [None, buf(ops)], null_count=0)
    value: Any = vals
    if not isinstance(vals, list):
        storage = pa.int64() if buffer_value_kind(value_type) == VALUE_INT64 else pa.float64()
        bitmap = None if validity is None else buf(validity)
        value = pa.Array.from_buffers(storage, n, [bitmap, buf(vals)], null_count=nulls)
        if overflow:
            py = value.to_pylist()
            for i, v in overflow:
                py[i] = v
            value = to_arrow(py, value_type)
        elif storage != value_type:
            value = value.cast(value_type)  # validated values: always in range
    return [key, kg, ns, op, value], kg_min, kg_max
