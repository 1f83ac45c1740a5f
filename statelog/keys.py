"""Stable key serialization, key groups and key-group ranges.

A key is serialized into a canonical byte string (format in ``docs/format.md``, section
"Key encoding"); its key group is ``fmix32(crc32(key_bytes)) % max_parallelism``. Both are
independent of the Python process (never ``hash()``), so every process, Spark worker and
later version computes the same key group for the same key.

Supported key types: ``None``, ``bool``, ``int`` (any size), ``float``, ``str``, ``bytes``
and tuples of these. Other types can be registered with :func:`register_key_type`.

Keys follow Python equality (key encoding version 2): keys that are equal in Python have
identical bytes, hence one key group and one entry everywhere (live state, changelog,
materialization, restore, readers). ``True``/``False`` encode as the ints ``1``/``0``, a
float with an integral value as the int it equals (``1.0`` -> ``1``, ``-0.0`` -> ``0``),
tuples element-wise; so ``1``, ``True`` and ``1.0`` are one key and decode as ``1``. NaN is
refused (it is not equal to itself). A registered custom type must not compare equal to a
builtin key. Version-1 bytes (``TAG_FALSE``/``TAG_TRUE``, integral floats) still decode.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statelog import _ext
from statelog.errors import ConfigError, CorruptionError, SerializationError

DEFAULT_MAX_PARALLELISM = 128
MAX_MAX_PARALLELISM = 32768

# The key encoding's version (docs/format.md 3): 2 since keys follow Python equality.
KEY_ENCODING_VERSION = 2

# Type tags of the key encoding. Never renumber.
TAG_NONE = 0x00
TAG_FALSE = 0x01  # written by version 1 only (version 2 writes False as int 0); still decoded
TAG_TRUE = 0x02  # written by version 1 only (version 2 writes True as int 1); still decoded
TAG_INT64 = 0x03
TAG_BIGINT = 0x04
TAG_FLOAT = 0x05
TAG_STR = 0x06
TAG_BYTES = 0x07
TAG_TUPLE = 0x08
TAG_CUSTOM = 0x10

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_pack_u64 = struct.Struct(">Q").pack
_unpack_u64 = struct.Struct(">Q").unpack_from
_pack_f64 = struct.Struct(">d").pack
_unpack_f64 = struct.Struct(">d").unpack_from
_SIGN = 1 << 63
_INT64_KEY = np.dtype([("tag", "u1"), ("value", ">u8")])  # an encoded int64 key: tag, biased value

_INT_FALSE = bytes((TAG_INT64,)) + _pack_u64(_SIGN)
_INT_TRUE = bytes((TAG_INT64,)) + _pack_u64(_SIGN + 1)
_NAN_MESSAGE = (
    "cannot use NaN as a key, namespace or map key (nor inside a tuple key): NaN is not equal "
    "to itself, so state stored under it could never be found again; map NaN to None or to a "
    "string such as 'nan' before using it as a key"
)

_custom_by_type: dict[type, tuple[str, Callable[[Any], bytes]]] = {}
_custom_by_name: dict[str, Callable[[bytes], Any]] = {}


def register_key_type(
    cls: type, name: str, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any]
) -> None:
    """Make instances of ``cls`` usable as keys (and namespaces, map keys).

    ``name`` is written into every serialized key and must stay stable for the life of
    the job; ``encode`` must be deterministic (equal objects give equal bytes) and
    ``decode(encode(x)) == x``. Keys follow Python equality, so instances must not compare
    equal to a builtin key (e.g. an ``IntEnum`` equals an int): two equal keys with
    different bytes would be one entry in the live state but two in the changelog. Register
    no such type; convert it to the builtin value it equals instead.
    """
    if not name or not isinstance(name, str):
        raise ConfigError("register_key_type: name must be a non-empty string")
    existing = _custom_by_name.get(name)
    if existing is not None and _custom_by_type.get(cls, (None,))[0] != name:
        raise ConfigError(f"register_key_type: the name {name!r} is already registered for another type")
    _custom_by_type[cls] = (name, encode)
    _custom_by_name[name] = decode


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise CorruptionError("truncated varint in serialized key")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _encode_into(obj: Any, out: bytearray) -> None:
    t = type(obj)
    if t is str:
        b = obj.encode("utf-8")
        out.append(TAG_STR)
        out += _varint(len(b))
        out += b
    elif t is int:
        if _INT64_MIN <= obj <= _INT64_MAX:
            out.append(TAG_INT64)
            out += _pack_u64((obj + _SIGN) & 0xFFFFFFFFFFFFFFFF)
        else:
            n = (obj.bit_length() + 8) // 8
            b = obj.to_bytes(n, "big", signed=True)
            out.append(TAG_BIGINT)
            out += _varint(len(b))
            out += b
    elif obj is None:
        out.append(TAG_NONE)
    elif t is bool:  # the int it equals: True == 1 is one key
        out += _INT_TRUE if obj else _INT_FALSE
    elif t is bytes:
        out.append(TAG_BYTES)
        out += _varint(len(obj))
        out += obj
    elif t is float:
        if obj.is_integer():  # the int it equals (1.0 == 1, -0.0 == 0); False for inf and NaN
            _encode_into(int(obj), out)
        elif obj != obj:
            raise SerializationError(_NAN_MESSAGE)
        else:
            out.append(TAG_FLOAT)
            out += _pack_f64(obj)
    elif t is tuple:
        out.append(TAG_TUPLE)
        out += _varint(len(obj))
        for item in obj:
            _encode_into(item, out)
    else:
        custom = _custom_by_type.get(t)
        if custom is None:
            raise SerializationError(
                f"cannot serialize a key of type {t.__module__}.{t.__qualname__}: keys must be "
                "None, bool, int, float, str, bytes or tuples of these; register other types "
                "with statelog.register_key_type(cls, name, encode, decode)"
            )
        name, enc = custom
        payload = enc(obj)
        if not isinstance(payload, bytes):
            raise SerializationError(f"the key encoder registered as {name!r} returned {type(payload).__name__}, expected bytes")
        nb = name.encode("utf-8")
        out.append(TAG_CUSTOM)
        out += _varint(len(nb))
        out += nb
        out += _varint(len(payload))
        out += payload


def encode_key(obj: Any) -> bytes:
    """Serialize a key (or namespace, or map key) into its canonical bytes."""
    t = type(obj)
    if t is str:
        b = obj.encode("utf-8")
        if len(b) < 128:
            return bytes((TAG_STR, len(b))) + b
    elif t is int and _INT64_MIN <= obj <= _INT64_MAX:
        return b"\x03" + _pack_u64((obj + _SIGN) & 0xFFFFFFFFFFFFFFFF)
    elif obj is None:
        return b"\x00"
    out = bytearray()
    _encode_into(obj, out)
    return bytes(out)


def _decode_at(buf: bytes, pos: int) -> tuple[Any, int]:
    if pos >= len(buf):
        raise CorruptionError("truncated serialized key")
    tag = buf[pos]
    pos += 1
    if tag == TAG_STR:
        n, pos = _read_varint(buf, pos)
        return buf[pos : pos + n].decode("utf-8"), pos + n
    if tag == TAG_INT64:
        return _unpack_u64(buf, pos)[0] - _SIGN, pos + 8
    if tag == TAG_NONE:
        return None, pos
    if tag == TAG_FALSE:
        return False, pos
    if tag == TAG_TRUE:
        return True, pos
    if tag == TAG_BYTES:
        n, pos = _read_varint(buf, pos)
        return bytes(buf[pos : pos + n]), pos + n
    if tag == TAG_FLOAT:
        return _unpack_f64(buf, pos)[0], pos + 8
    if tag == TAG_BIGINT:
        n, pos = _read_varint(buf, pos)
        return int.from_bytes(buf[pos : pos + n], "big", signed=True), pos + n
    if tag == TAG_TUPLE:
        n, pos = _read_varint(buf, pos)
        items = []
        for _ in range(n):
            item, pos = _decode_at(buf, pos)
            items.append(item)
        return tuple(items), pos
    if tag == TAG_CUSTOM:
        n, pos = _read_varint(buf, pos)
        name = buf[pos : pos + n].decode("utf-8")
        pos += n
        n, pos = _read_varint(buf, pos)
        dec = _custom_by_name.get(name)
        if dec is None:
            raise SerializationError(
                f"a stored key uses the custom key type {name!r}, which is not registered in this "
                "process; call statelog.register_key_type before restoring"
            )
        return dec(bytes(buf[pos : pos + n])), pos + n
    raise CorruptionError(f"unknown key type tag 0x{tag:02x} in serialized key")


def decode_key(buf: bytes) -> Any:
    """Inverse of :func:`encode_key`."""
    try:
        obj, pos = _decode_at(buf, 0)
    except (struct.error, UnicodeDecodeError, IndexError) as e:
        raise CorruptionError(f"malformed serialized key {bytes(buf[:32]).hex()}: {e}") from None
    if pos != len(buf):
        raise CorruptionError(f"{len(buf) - pos} trailing bytes after serialized key")
    return obj


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

    n = len(arr)
    if n == 0:
        return []
    if arr.null_count == 0 and pa.types.is_binary(arr.type):
        lo, hi = (x.as_py() for x in pc.min_max(pc.binary_length(arr)).values())
        if lo == hi == 9:  # int64 keys if every tag byte is TAG_INT64
            offsets = arr.buffers()[1]
            (first,) = struct.unpack_from("<i", offsets, arr.offset * 4)
            data = memoryview(arr.buffers()[2])[first : first + 9 * n]
            if data[::9].tobytes().count(TAG_INT64) == n:
                # big-endian value + 2^63: flipping the top bit gives the two's complement
                biased = np.frombuffer(data, dtype=_INT64_KEY)["value"].astype("<u8")
                return (biased ^ np.uint64(_SIGN)).view("<i8").tolist()
        tags = pc.binary_slice(arr, 0, 1)
        tag = tags[0].as_py()[0] if pc.count_distinct(tags).as_py() == 1 else None
        if tag == TAG_STR and hi <= 129:  # one-byte varint length: the rest is the string
            try:  # tag and length (< 128) are ASCII, so they are the first two code units
                return pc.utf8_slice_codeunits(arr.cast(pa.string()), 2).to_pylist()
            except pa.ArrowInvalid as e:
                raise CorruptionError(f"malformed serialized string keys: {e}") from None
    return [decode_key(b) for b in arr.to_pylist()]


def is_legacy_key(key: Any) -> bool:
    """Whether a decoded key can only come from key encoding version 1: it holds a ``bool``,
    a float with an integral value or a NaN, which version 2 never decodes to."""
    t = type(key)
    if t is bool:
        return True
    if t is float:
        return key != key or key.is_integer()
    if t is tuple:
        return any(is_legacy_key(x) for x in key)
    return False


_LEGACY_TAGS = (TAG_FALSE, TAG_TRUE, TAG_FLOAT, TAG_TUPLE)


def first_legacy_key(arr: Any) -> bytes | None:
    """The first encoded key of an Arrow ``binary`` array that version 2 encodes differently
    (a version-1 ``bool``, integral float or NaN, also inside a tuple), else ``None``.

    One Arrow pass over the tag bytes; only keys tagged bool, float or tuple are decoded.
    """

    if len(arr) == 0:
        return None
    tags = pc.binary_slice(arr, 0, 1)
    maybe = pc.is_in(tags, pa.array([bytes((t,)) for t in _LEGACY_TAGS], tags.type))
    if not pc.any(maybe).as_py():
        return None
    for kb in arr.filter(maybe).to_pylist():
        if is_legacy_key(decode_key(kb)):
            return kb
    return None


def check_map_key(user_key: Any) -> None:
    """Refuse a NaN map user key (also inside a tuple): it could never be found again."""
    t = type(user_key)
    if (t is float and user_key != user_key) or (t is tuple and _holds_nan(user_key)):
        raise SerializationError(_NAN_MESSAGE)


def _holds_nan(obj: Any) -> bool:
    t = type(obj)
    if t is float:
        return obj != obj
    return t is tuple and any(_holds_nan(x) for x in obj)


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


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def key_group_of_bytes_py(key_bytes: bytes, max_parallelism: int) -> int:
    """The key group of serialized key bytes: murmur3 fmix32 of CRC-32, modulo ``max_parallelism``
    (the reference; ``key_group_of_bytes`` is its C version when statelog/_ext is built)."""
    return _fmix32(zlib.crc32(key_bytes)) % max_parallelism


_workingset_ext = _ext.load("workingset")
key_group_of_bytes: Callable[[bytes, int], int] = (
    _workingset_ext.key_group if _workingset_ext is not None else key_group_of_bytes_py
)


def key_group_of(key: Any, max_parallelism: int) -> int:
    """The key group of a key: ``fmix32(crc32(encode_key(key))) % max_parallelism``."""
    return key_group_of_bytes(encode_key(key), max_parallelism)


def check_max_parallelism(max_parallelism: Any) -> int:
    if type(max_parallelism) is not int or not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ConfigError(
            f"max_parallelism must be an int in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism!r}"
        )
    return max_parallelism


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """An inclusive range of key groups ``[start, end]``; empty when ``end < start``."""

    start: int
    end: int

    @staticmethod
    def empty() -> KeyGroupRange:
        return KeyGroupRange(0, -1)

    @property
    def is_empty(self) -> bool:
        return self.end < self.start

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, kg: object) -> bool:
        return isinstance(kg, int) and self.start <= kg <= self.end

    def __iter__(self):  # type: ignore[override]
        return iter(range(self.start, self.end + 1))

    def intersect(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()

    def overlaps(self, lo: int, hi: int) -> bool:
        return not self.is_empty and lo <= self.end and hi >= self.start

    def to_json(self) -> list[int]:
        return [self.start, self.end]

    @staticmethod
    def from_json(value: Any) -> KeyGroupRange:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(type(v) is int for v in value)
        ):
            raise CorruptionError(f"a key-group range must be [start, end], got {value!r}")
        return KeyGroupRange(value[0], value[1])

    def __str__(self) -> str:
        return f"[{self.start}..{self.end}]" if not self.is_empty else "[]"


def check_parallelism(parallelism: Any, max_parallelism: int) -> int:
    if type(parallelism) is not int or not 1 <= parallelism <= max_parallelism:
        raise ConfigError(
            f"parallelism must be an int in 1..max_parallelism ({max_parallelism}), got {parallelism!r}"
        )
    return parallelism


def key_group_range_for_subtask(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """The key groups owned by subtask ``index`` of ``parallelism`` (Flink's formula)."""
    check_parallelism(parallelism, max_parallelism)
    if type(index) is not int or not 0 <= index < parallelism:
        raise ConfigError(f"subtask index must be in 0..{parallelism - 1}, got {index!r}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask index that owns ``key_group``: ``key_group * parallelism // max_parallelism``."""
    return key_group * parallelism // max_parallelism
