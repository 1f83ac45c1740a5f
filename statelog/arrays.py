"""Arrow arrays from and to numpy through their buffers, without pandas.

pyarrow imports pandas (~0.2 s) on the first ``pa.array(...)`` or ``.to_numpy()`` of a
process (it checks whether its argument is a pandas object). The restore path, the first
records of a restarted process and the materializer's merge of value-like states use these
instead, so that a restart does not pay that import (docs/performance.md, "Start-up");
``tests/architecture/test_startup_imports.py`` checks it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_INT32_MAX = (1 << 31) - 1


def binary_array(values: list[bytes]) -> pa.Array:
    """``pa.array(values, pa.binary())`` (no nulls) built from its buffers."""
    data = b"".join(values)
    if len(data) > _INT32_MAX:  # beyond int32 offsets: pyarrow chooses the chunking
        return pa.array(values, pa.binary())
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int32, count=len(values)), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def integer_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``column.to_numpy()`` of an integer column without nulls (a read-only view of one
    chunk's buffer, a copy of several); other columns go through ``to_numpy``."""
    t = column.type
    if not pa.types.is_integer(t) or column.null_count:
        return column.to_numpy(zero_copy_only=False)
    dtype = _fixed_dtype(t)
    assert dtype is not None
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [np.frombuffer(c.buffers()[1], dtype, len(c), c.offset * dtype.itemsize) for c in chunks if len(c)]
    if not parts:
        return np.empty(0, dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def booleans(values: np.ndarray) -> pa.Array:
    """``pa.array(values, pa.bool_())`` of a one-dimensional numpy array of booleans (no nulls),
    bit-packed into its buffer."""
    values = np.asarray(values, dtype=bool)
    bits = np.packbits(values, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])


def binary_offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` int32 offsets of a ``binary`` or ``string`` array (into its data
    buffer), a view of its offsets buffer."""
    return np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)


def _valid_mask(arr: pa.Array) -> np.ndarray:
    """The validity of ``arr``'s slots as booleans (``arr`` has nulls)."""
    bits = np.frombuffer(arr.buffers()[0], np.uint8)
    return np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + len(arr)].view(bool)


def _fixed_dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(t):
        return np.dtype(f"<{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    if pa.types.is_floating(t) and t.bit_width in (32, 64):
        return np.dtype(f"<f{t.bit_width // 8}")
    return None


def take_array(arr: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """``arr.take(rows)`` (``rows`` valid int indices) gathered in numpy for the columns of a
    changelog block (null, integer, float, binary and string, with or without nulls), without
    ``pyarrow.compute`` (an import of ~0.04 s that pulls in ``pydoc``); other types go
    through ``Array.take``."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    t, n = arr.type, len(rows)
    rows = np.asarray(rows, dtype=np.int64)
    if n == 0:
        return arr.slice(0, 0)
    if pa.types.is_null(t):
        return pa.nulls(n)
    dtype = _fixed_dtype(t)
    is_bin = t in (pa.binary(), pa.string())
    if dtype is None and not is_bin:
        return arr.take(numpy_integers(rows))
    validity, nulls = None, 0
    if arr.null_count:
        valid = _valid_mask(arr)[rows]
        nulls = n - int(np.count_nonzero(valid))
        if nulls:
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    bufs = arr.buffers()
    if dtype is not None:
        data = np.frombuffer(bufs[1], dtype, len(arr), arr.offset * dtype.itemsize)[rows]
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(data)], nulls)
    offs = binary_offsets(arr)
    starts, lens = offs[rows].astype(np.int64), (offs[rows + 1] - offs[rows]).astype(np.int64)
    new = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=new[1:])
    total = int(new[-1])
    if total > _INT32_MAX:
        return arr.take(numpy_integers(rows))
    data = b""
    if total:
        src = np.frombuffer(bufs[2], np.uint8)
        data = src[np.repeat(starts - new[:-1], lens) + np.arange(total)].tobytes()
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(new.astype(np.int32)), pa.py_buffer(data)], nulls)


def all_equal_bytes(column: pa.Array | pa.ChunkedArray, value: bytes) -> bool:
    """Whether every slot of a ``binary`` column (no nulls) is ``value``, compared in numpy."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    want = np.frombuffer(value, np.uint8)
    for c in chunks:
        n = len(c)
        if n == 0:
            continue
        if c.null_count or c.type != pa.binary():
            return c.to_pylist() == [value] * n
        offs = binary_offsets(c)
        if not bool((np.diff(offs) == len(value)).all()):
            return False
        if value:
            data = np.frombuffer(c.buffers()[2], np.uint8)[int(offs[0]) : int(offs[-1])]
            if not bool((data.reshape(n, len(value)) == want).all()):
                return False
    return True


def take_table(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``: a zero-copy slice when ``rows`` is one ascending run, else column
    by column with :func:`take_array`."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return table.slice(0, 0)
    first, last = int(rows[0]), int(rows[-1])
    if last - first + 1 == len(rows) and (len(rows) < 3 or bool((np.diff(rows) == 1).all())):
        return table.slice(first, len(rows))
    return pa.Table.from_arrays([take_array(c, rows) for c in table.columns], schema=table.schema)


def numpy_integers(values: np.ndarray) -> pa.Array:
    """``pa.array(values)`` of a one-dimensional integer ndarray (e.g. ``take`` indices),
    sharing its buffer when it is contiguous."""
    values = np.ascontiguousarray(values)
    t = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(t, len(values), [None, pa.py_buffer(values)])
