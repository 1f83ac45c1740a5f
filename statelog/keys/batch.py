"""Keys of a batch: their canonical bytes and key groups, a whole column at a time.

:func:`encode_keys` gives the keys of a batch (an Arrow array or a Python sequence) as
Python objects (the tables' keys) and their encodings (:func:`statelog.keys.encoding.encode_key`)
as one Arrow ``binary`` array; :func:`key_groups_of` their key groups with the hash of the
per-record path (``fmix32(crc32(key_bytes)) % max_parallelism``, :mod:`statelog.keys.groups`).
Columns of int64 keys and of short strings are encoded with numpy, other keys key by key; the
key groups of a column are computed in C (``key_groups`` of ``statelog/_ext/workingset.c``), or,
when it is not built, with a table-driven CRC-32 over the byte columns in numpy.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pyarrow as pa

from statelog import _ext
from statelog.arrays import binary_offsets
from statelog.compute import pc
from statelog.keys.encoding import INT64_BIAS, TAG_INT64, TAG_STR, encode_key

_CRC_TABLE = np.zeros(256, np.uint32)
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0xEDB88320 if _c & 1 else _c >> 1
    _CRC_TABLE[_i] = _c
_FULL = np.uint32(0xFFFFFFFF)
# the key groups of a binary column in C (None: not built, or STATELOG_PURE_PYTHON set)
_key_groups = getattr(_ext.load("workingset"), "key_groups", None)


def as_key_array(keys: Any) -> pa.Array | None:
    """``keys`` as an Arrow array when it is one (chunks combined), else ``None``."""
    if isinstance(keys, pa.ChunkedArray):
        return keys.combine_chunks()
    if isinstance(keys, pa.Array):
        return keys
    return None


def encode_keys(keys: Any, int_column: bool = False) -> tuple[list[Any] | np.ndarray, pa.Array]:
    """``(python keys, encoded keys)`` of a batch of keys: an Arrow array (int, string,
    binary, ...) or a Python sequence. Null keys are the key ``None``. ``int_column``: the
    keys of an Arrow integer array without nulls come as its int64 numpy array, not as a list
    of ints (for a caller that makes the ints itself, as ``add_many``'s fold in C does)."""
    arr = as_key_array(keys)
    if arr is not None:
        if arr.null_count == 0 and (pa.types.is_integer(arr.type) and arr.type != pa.uint64()):
            ints = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            return ints if int_column else ints.tolist(), int64_keys(ints)
        if arr.null_count == 0 and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            kbs = _str_keys(arr)
            if kbs is not None:
                return arr.to_pylist(), kbs
        pykeys = arr.to_pylist()
    else:
        pykeys = keys if isinstance(keys, list) else list(keys)
        if pykeys and all(type(k) is int for k in pykeys):
            try:
                ints = np.fromiter(pykeys, np.int64, len(pykeys))
            except OverflowError:
                ints = None
            if ints is not None:
                return pykeys, int64_keys(ints)
    return pykeys, pa.array(list(map(encode_key, pykeys)), pa.binary())


def int64_keys(ints: np.ndarray) -> pa.Array:
    """Tag byte and the big-endian value + 2^63 (``docs/format.md`` 3.1), 9 bytes each."""
    n = len(ints)
    rec = np.empty(n, np.dtype([("tag", "u1"), ("value", ">u8")]))
    rec["tag"] = TAG_INT64
    rec["value"] = ints.view(np.uint64) ^ np.uint64(INT64_BIAS)
    offsets = np.arange(0, 9 * n + 1, 9, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rec.view(np.uint8))])


def _str_keys(arr: pa.Array) -> pa.Array | None:
    """Tag byte, one-byte length and the UTF-8 bytes of strings under 128 bytes; else ``None``."""
    arr = arr.cast(pa.string())
    n = len(arr)
    if n == 0:
        return pa.array([], pa.binary())
    lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False)
    if int(lengths.max()) >= 128:
        return None
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]]
    new_off = np.zeros(n + 1, np.int32)
    np.cumsum(lengths + 2, out=new_off[1:])
    out = np.empty(int(new_off[-1]), np.uint8)
    heads = new_off[:-1]
    body = np.ones(len(out), bool)
    body[heads] = False
    body[heads + 1] = False
    out[heads] = TAG_STR
    out[heads + 1] = lengths
    out[body] = data
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(new_off), pa.py_buffer(out)])


def crc32_of(kbs: pa.Array) -> np.ndarray:
    """CRC-32 (zlib's) of every value of a ``binary`` array, as uint32."""
    n = len(kbs)
    if n == 0:
        return np.zeros(0, np.uint32)
    offsets = np.frombuffer(kbs.buffers()[1], np.int32, n + 1, kbs.offset * 4)
    lengths = np.diff(offsets)
    width = int(lengths[0])
    if (lengths == width).all():
        data = np.frombuffer(kbs.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(n, width)
        crc = np.full(n, _FULL, np.uint32)
        for j in range(width):
            crc = _CRC_TABLE[(crc ^ data[:, j]) & 0xFF] ^ (crc >> 8)
        return crc ^ _FULL
    return np.fromiter(map(zlib.crc32, kbs.to_pylist()), np.uint32, n)


def key_groups_of(kbs: pa.Array, max_parallelism: int) -> np.ndarray:
    """The key group of every encoded key: ``fmix32(crc32(kb)) % max_parallelism`` (uint16)."""
    if _key_groups is not None and kbs.type == pa.binary() and kbs.null_count == 0 and len(kbs):
        out = np.empty(len(kbs), np.uint16)
        data = kbs.buffers()[2]
        _key_groups(binary_offsets(kbs), b"" if data is None else data, max_parallelism, out)
        return out
    return key_groups_numpy(kbs, max_parallelism)


def key_groups_numpy(kbs: pa.Array, max_parallelism: int) -> np.ndarray:
    """:func:`key_groups_of` in numpy (the reference of the C version, and its fallback)."""
    h = crc32_of(kbs).astype(np.uint64)
    m = np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    return (h % np.uint64(max_parallelism)).astype(np.uint16)


__all__ = ["as_key_array", "crc32_of", "encode_keys", "int64_keys", "key_groups_numpy", "key_groups_of"]
