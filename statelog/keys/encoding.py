"""Stable key serialization: a key's canonical bytes and back.

A key (or namespace, or map key of a timer) is serialized into a canonical byte string
(format in ``docs/format.md``, section "Key encoding"; ``statelog/_ext/keyenc.h`` is the C
version of the two common key types). The bytes are independent of the Python process
(never ``hash()``), so every process, Spark worker and later version writes the same bytes,
and the key group computed from them (:mod:`statelog.keys.groups`) is the same everywhere.

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
from collections.abc import Callable
from typing import Any

from statelog.errors import ConfigError, CorruptionError, SerializationError

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
INT64_BIAS = 1 << 63  # added to an int64 key: unsigned big-endian bytes

_INT_FALSE = bytes((TAG_INT64,)) + _pack_u64(INT64_BIAS)
_INT_TRUE = bytes((TAG_INT64,)) + _pack_u64(INT64_BIAS + 1)
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
            out += _pack_u64((obj + INT64_BIAS) & 0xFFFFFFFFFFFFFFFF)
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


def subclassed_key_types() -> bool:
    """A registered key type subclasses ``int`` or ``str``: Arrow infers its keys as ints or
    strings, which they are not encoded as (bulk encoders check this before inferring)."""
    return any(issubclass(t, int | str) for t in _custom_by_type)


def encode_key(obj: Any) -> bytes:
    """Serialize a key (or namespace, or map key) into its canonical bytes."""
    t = type(obj)
    if t is str:
        b = obj.encode("utf-8")
        if len(b) < 128:
            return bytes((TAG_STR, len(b))) + b
    elif t is int and _INT64_MIN <= obj <= _INT64_MAX:
        return b"\x03" + _pack_u64((obj + INT64_BIAS) & 0xFFFFFFFFFFFFFFFF)
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
        return _unpack_u64(buf, pos)[0] - INT64_BIAS, pos + 8
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
