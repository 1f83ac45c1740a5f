"""Stable key serialization, key groups and key-group ranges.

A key is serialized into a canonical byte string (format in ``docs/format.md``, section
"Key encoding"); its key group is ``fmix32(crc32(key_bytes)) % max_parallelism``. Both are
independent of the Python process (never ``hash()``), so every process, Spark worker and
later version computes the same key group for the same key.

Supported key types: ``None``, ``bool``, ``int`` (any size), ``float``, ``str``, ``bytes``
and tuples of these. Other types can be registered with :func:`register_key_type`.
Keys that compare equal in Python but differ in type (``1``, ``1.0``, ``True``) are
distinct keys here; do not mix them within one operator.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statelog.errors import ConfigError, CorruptionError, SerializationError

DEFAULT_MAX_PARALLELISM = 128
MAX_MAX_PARALLELISM = 32768

# Type tags of the key encoding (version 1). Never renumber.
TAG_NONE = 0x00
TAG_FALSE = 0x01
TAG_TRUE = 0x02
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

_custom_by_type: dict[type, tuple[str, Callable[[Any], bytes]]] = {}
_custom_by_name: dict[str, Callable[[bytes], Any]] = {}


def register_key_type(
    cls: type, name: str, encode: Callable[[Any], bytes], decode: Callable[[bytes], Any]
) -> None:
    """Make instances of ``cls`` usable as keys (and namespaces, map keys).

    ``name`` is written into every serialized key and must stay stable for the life of
    the job; ``encode`` must be deterministic (equal objects give equal bytes) and
    ``decode(encode(x)) == x``.
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
    elif t is bool:
        out.append(TAG_TRUE if obj else TAG_FALSE)
    elif t is bytes:
        out.append(TAG_BYTES)
        out += _varint(len(obj))
        out += obj
    elif t is float:
        out.append(TAG_FLOAT)
        out += _pack_f64(0.0 if obj == 0.0 else obj)  # -0.0 and 0.0 are one key
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


def decode_key_array(arr: Any) -> list[Any]:
    """Decode an Arrow ``binary`` array (or chunked array) of encoded keys into Python keys.

    Columns of only int64 keys or only short strings (the common key types) are decoded in
    bulk; anything else key by key with :func:`decode_key`.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        out: list[Any] = []
        for chunk in arr.chunks:
            out.extend(decode_key_array(chunk))
        return out
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
                sign = _SIGN
                return [v - sign for (v,) in struct.iter_unpack(">xQ", data)]
        tags = pc.binary_slice(arr, 0, 1)
        tag = tags[0].as_py()[0] if pc.count_distinct(tags).as_py() == 1 else None
        if tag == TAG_STR and hi <= 129:  # one-byte varint length: the rest is the string
            try:  # tag and length (< 128) are ASCII, so they are the first two code units
                return pc.utf8_slice_codeunits(arr.cast(pa.string()), 2).to_pylist()
            except pa.ArrowInvalid as e:
                raise CorruptionError(f"malformed serialized string keys: {e}") from None
    return [decode_key(b) for b in arr.to_pylist()]


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def key_hash(key_bytes: bytes) -> int:
    """The stable 32-bit hash of serialized key bytes: murmur3 fmix32 of CRC-32."""
    return _fmix32(zlib.crc32(key_bytes))


def key_group_of_bytes(key_bytes: bytes, max_parallelism: int) -> int:
    return _fmix32(zlib.crc32(key_bytes)) % max_parallelism


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

    @staticmethod
    def of_all(max_parallelism: int) -> KeyGroupRange:
        return KeyGroupRange(0, max_parallelism - 1)

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
