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
    dtype = np.dtype(f"<{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
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


def numpy_integers(values: np.ndarray) -> pa.Array:
    """``pa.array(values)`` of a one-dimensional integer ndarray (e.g. ``take`` indices),
    sharing its buffer when it is contiguous."""
    values = np.ascontiguousarray(values)
    t = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(t, len(values), [None, pa.py_buffer(values)])
