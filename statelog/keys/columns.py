"""Columns of encoded keys (Arrow ``binary`` arrays) and keys read into a declared type.

:func:`decode_key_array` decodes a column of encoded keys, in bulk for the common key types
(int64, short strings); :func:`first_legacy_key` finds a key that key encoding version 1
wrote differently in one pass over the tag bytes; :func:`coerce_key` gives a decoded key
the Python value of a declared Arrow type (``docs/format.md`` 3.5), as the readers do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import binary_array, binary_offsets
from statelog.compute import pc
from statelog.errors import CorruptionError, SerializationError
from statelog.keys.encoding import (
    INT64_BIAS,
    TAG_FALSE,
    TAG_FLOAT,
    TAG_INT64,
    TAG_STR,
    TAG_TRUE,
    TAG_TUPLE,
    decode_key,
    is_legacy_key,
)

_INT64_KEY = np.dtype([("tag", "u1"), ("value", ">u8")])  # an encoded int64 key: tag, biased value


def decode_key_array(arr: Any, key_type: Any = None) -> list[Any]:
    """Decode an Arrow ``binary`` array (or chunked array) of encoded keys into Python keys.

    Columns of only int64 keys or only short strings (the common key types) are decoded in
    bulk; anything else key by key with :func:`decode_key`. With ``key_type`` (an Arrow
    type, e.g. ``pa.float64()`` or ``pa.bool_()``) every key is converted to that type's
    Python value with :func:`coerce_key` (int ``1`` becomes ``1.0`` or ``True``).
    """

    if isinstance(arr, pa.ChunkedArray):
        out: list[Any] = []
        for chunk in arr.chunks:
            out.extend(decode_key_array(chunk))
    else:
        out = _decode_key_chunk(arr)
    if key_type is not None:
        out = coerce_keys(out, key_type)
    return out


def _decode_key_chunk(arr: Any) -> list[Any]:
    """One chunk of :func:`decode_key_array`, read through its buffers in numpy (a restarted
    process decodes its first key group without importing ``pyarrow.compute``)."""
    n = len(arr)
    if n == 0:
        return []
    if arr.null_count == 0 and arr.type == pa.binary():
        offs = binary_offsets(arr)
        lens = np.diff(offs)
        lo, hi = int(lens.min()), int(lens.max())
        if lo == 0:
            return [decode_key(b) for b in arr.to_pylist()]  # (raises: an encoded key is never empty)
        raw = arr.buffers()[2]
        if lo == hi == 9:  # int64 keys if every tag byte is TAG_INT64
            ints = _int64_keys(raw, int(offs[0]), n)
            if ints is not None:
                return ints.tolist()
        data = np.frombuffer(raw, np.uint8)
        tags = data[offs[:-1]]
        if lo >= 2 and hi <= 129 and bool((tags == TAG_STR).all()):  # one-byte varint length: the rest is the string
            base = int(offs[0])
            keep = np.ones(int(offs[-1]) - base, bool)
            keep[offs[:-1] - base] = False  # drop each key's tag and length bytes
            keep[offs[:-1] - base + 1] = False
            new = (offs - base - 2 * np.arange(n + 1, dtype=np.int32)).astype(np.int32)
            strings = pa.Array.from_buffers(
                pa.string(), n, [None, pa.py_buffer(new), pa.py_buffer(data[base : int(offs[-1])][keep].tobytes())])
            try:
                strings.validate(full=True)  # UTF-8
            except pa.ArrowInvalid as e:
                raise CorruptionError(f"malformed serialized string keys: {e}") from None
            return strings.to_pylist()
    return [decode_key(b) for b in arr.to_pylist()]


def _int64_keys(raw: Any, start: int, n: int) -> np.ndarray | None:
    """The ``n`` 9-byte keys from ``start`` of ``raw`` as int64s, or ``None`` unless every
    one is tagged int64."""
    data = memoryview(raw)[start : start + 9 * n]
    if data[::9].tobytes().count(TAG_INT64) != n:
        return None
    # big-endian value + 2^63: flipping the top bit gives the two's complement
    biased = np.frombuffer(data, dtype=_INT64_KEY)["value"].astype("<u8")
    return (biased ^ np.uint64(INT64_BIAS)).view("<i8")


def int64_key_array(arr: Any) -> np.ndarray | None:
    """A column of encoded keys (``binary``, one chunk or several) as an int64 numpy array when
    every key is an int64 (no key objects), else ``None``."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if arr.type != pa.binary() or arr.null_count:
        return None
    if n == 0:
        return np.empty(0, np.int64)
    offs = binary_offsets(arr)
    if int(offs[-1]) - int(offs[0]) != 9 * n or not bool((np.diff(offs) == 9).all()):
        return None
    return _int64_keys(arr.buffers()[2], int(offs[0]), n)


def encode_int64_keys(keys: np.ndarray) -> pa.Array:
    """int64 keys as their encoded bytes (a ``binary`` array): :func:`int64_key_array`'s inverse."""
    n = len(keys)
    out = np.empty(n, dtype=_INT64_KEY)
    out["tag"] = TAG_INT64
    out["value"] = np.asarray(keys, np.int64).view("<u8") ^ np.uint64(INT64_BIAS)
    offsets = np.arange(0, 9 * n + 1, 9, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())])


_LEGACY_TAGS = (TAG_FALSE, TAG_TRUE, TAG_FLOAT, TAG_TUPLE)


def first_legacy_key(arr: Any) -> bytes | None:
    """The first encoded key of an Arrow ``binary`` array that version 2 encodes differently
    (a version-1 ``bool``, integral float or NaN, also inside a tuple), else ``None``.

    One Arrow pass over the tag bytes; only keys tagged bool, float or tuple are decoded.
    """

    if len(arr) == 0:
        return None
    if arr.type != pa.binary() or arr.null_count:
        tags = pc.binary_slice(arr, 0, 1)
        maybe = pc.is_in(tags, binary_array([bytes((t,)) for t in _LEGACY_TAGS]).cast(tags.type))
        if not pc.any(maybe).as_py():
            return None
        candidates = arr.filter(maybe).to_pylist()
    else:  # the tag bytes in numpy (no pyarrow.compute on a restarted process's first key group)
        offs = binary_offsets(arr)
        data = np.frombuffer(arr.buffers()[2] or b"", np.uint8)
        nonempty = np.flatnonzero(offs[1:] > offs[:-1])  # (an encoded key is never empty)
        hits = nonempty[np.isin(data[offs[nonempty]], np.array(_LEGACY_TAGS, np.uint8))]
        if len(hits) == 0:
            return None
        candidates = [arr[int(i)].as_py() for i in hits]
    for kb in candidates:
        if is_legacy_key(decode_key(kb)):
            return kb
    return None


def _misfit(key: Any, key_type: Any, why: str, hint: str) -> SerializationError:
    return SerializationError(
        f"the declared key type is {key_type}, but the state holds key {key!r} of type "
        f"{type(key).__name__}, {why}; {hint}"
    )


def coerce_key(key: Any, key_type: Any) -> Any:
    """A decoded key as the Python value of a declared Arrow column type (readers).

    Keys are stored normalized (``True`` and ``1.0`` as the int ``1``), so a reader that
    declares the key column's type converts: a floating type gets ``1.0`` from int ``1``, a
    boolean type ``True``/``False`` from int ``1``/``0``, an integer type ``1`` from ``1.0``
    (version-1 bytes). A key that does not fit (int ``2`` as boolean, ``1.5`` as an
    integer, an int that no binary64 float equals) raises :class:`SerializationError`.
    Other types (string, binary, ...) are returned as they are; ``None`` stays ``None``.
    """

    if key is None:
        return None
    t = type(key)
    numeric = t is int or t is float or t is bool
    if pa.types.is_boolean(key_type):
        if t is bool:
            return key
        if numeric and key in (0, 1):
            return bool(key)
        raise _misfit(key, key_type, "which is not a boolean (False and True are stored as the ints 0 "
                      "and 1)", "declare the key type the state holds (e.g. int64)")
    if pa.types.is_integer(key_type):
        if t is int or t is bool:
            return int(key)
        if t is float and key.is_integer():
            return int(key)
        hint = "declare a floating type such as double" if t is float else "declare the key type the state holds"
        raise _misfit(key, key_type, "which is not an integer", hint)
    if pa.types.is_floating(key_type):
        if t is float:
            return key
        if t is int or t is bool:
            try:
                f = float(key)
            except OverflowError:
                f = None
            if f is not None and f == key:
                return f
            raise _misfit(key, key_type, "which no binary64 float equals", "declare an integer type such as int64")
        raise _misfit(key, key_type, "which is not a number", "declare the key type the state holds")
    return key


def coerce_keys(keys: list[Any], key_type: Any) -> list[Any]:
    """:func:`coerce_key` of every key (types other than bool, integer and floating as is)."""

    if not (pa.types.is_boolean(key_type) or pa.types.is_integer(key_type) or pa.types.is_floating(key_type)):
        return keys
    if pa.types.is_integer(key_type) and all(type(k) is int for k in keys):
        return keys
    return [coerce_key(k, key_type) for k in keys]
