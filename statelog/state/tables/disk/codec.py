"""The values of a working set's database: a plain form of plain types, a pickle for the rest.

A value (a key's record ``{state id: entry}``, or a namespaced entry) made of None, bool,
int64, float, str, bytes and lists, tuples and dicts of them is written in a plain form
that reads back without pickle; any other value is a pickle (docs/format.md section 10).
:func:`rec_dumps_py` and :func:`rec_loads_py` are the reference of the C version
(statelog/_ext/reccodec.h, in the ``workingset`` accelerator); :data:`dumps` and
:data:`loads` are the C version when it is built, else these.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

from statelog import _ext

PROTOCOL = pickle.HIGHEST_PROTOCOL
REC_MAGIC = 0x01
_REC_PICKLE = 0x80  # a pickle of protocol 2 or later starts with PROTO
_REC_MAX_DEPTH = 32
_R_NONE, _R_FALSE, _R_TRUE, _R_INT, _R_FLOAT, _R_STR, _R_BYTES, _R_LIST, _R_TUPLE, _R_DICT = range(10)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_F64 = struct.Struct("<d")


class _NotPlain(Exception):
    """A value outside the plain form's types."""


def _uv(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _rec_enc(o: Any, out: list[bytes], depth: int) -> None:
    t = type(o)
    if o is None:
        out.append(bytes((_R_NONE,)))
    elif t is bool:
        out.append(bytes((_R_TRUE if o else _R_FALSE,)))
    elif t is int:
        if not _INT64[0] <= o <= _INT64[1]:
            raise _NotPlain
        out.append(bytes((_R_INT,)) + _uv(((o << 1) ^ (o >> 63)) & 0xFFFFFFFFFFFFFFFF))
    elif t is float:
        out.append(bytes((_R_FLOAT,)) + _F64.pack(o))
    elif t is str or t is bytes:
        if t is str:
            try:
                o = o.encode()
            except UnicodeEncodeError:  # lone surrogates: pickle keeps them
                raise _NotPlain from None
        out.append(bytes((_R_STR if t is str else _R_BYTES,)) + _uv(len(o)) + o)
    elif depth >= _REC_MAX_DEPTH:
        raise _NotPlain
    elif t is list or t is tuple:
        out.append(bytes((_R_LIST if t is list else _R_TUPLE,)) + _uv(len(o)))
        for e in o:
            _rec_enc(e, out, depth + 1)
    elif t is dict:
        out.append(bytes((_R_DICT,)) + _uv(len(o)))
        for k, v in o.items():
            _rec_enc(k, out, depth + 1)
            _rec_enc(v, out, depth + 1)
    else:
        raise _NotPlain


def rec_dumps_py(value: Any, protocol: int) -> bytes:
    """A value of the database (a key's record or a namespaced entry) as bytes: the plain
    form when it is made of None, bool, int of int64, float, str, bytes, and lists, tuples and
    dicts of them (exact types, at most 32 deep), else a pickle (protocol 2 or later)."""
    out = [bytes((REC_MAGIC,))]
    try:
        _rec_enc(value, out, 0)
    except _NotPlain:
        if protocol < 2:
            raise ValueError("rec_dumps: the pickle protocol must be 2 or later") from None
        return pickle.dumps(value, protocol)
    return b"".join(out)


def _rec_corrupt(what: str) -> ValueError:
    return ValueError(f"a working-set value does not parse: {what}")


def _rec_get_uv(raw: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while shift < 64 and i < len(raw):
        c = raw[i]
        i += 1
        if shift == 63 and c > 1:
            break
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, i
        shift += 7
    raise _rec_corrupt("a bad length or int")


def _rec_dec(raw: bytes, i: int, depth: int) -> tuple[Any, int]:
    if i >= len(raw):
        raise _rec_corrupt("it ends inside a value")
    tag = raw[i]
    i += 1
    if tag <= _R_TRUE:
        return (None, False, True)[tag], i
    if tag == _R_INT:
        u, i = _rec_get_uv(raw, i)
        return (u >> 1) ^ -(u & 1), i
    if tag == _R_FLOAT:
        if len(raw) - i < 8:
            raise _rec_corrupt("it ends inside a float")
        return _F64.unpack_from(raw, i)[0], i + 8
    if tag in (_R_STR, _R_BYTES):
        n, i = _rec_get_uv(raw, i)
        if n > len(raw) - i:
            raise _rec_corrupt("a length beyond its end")
        b = raw[i : i + n]
        return (b.decode() if tag == _R_STR else b), i + n
    if tag in (_R_LIST, _R_TUPLE, _R_DICT):
        if depth >= _REC_MAX_DEPTH:
            raise _rec_corrupt("nested too deep")
        n, i = _rec_get_uv(raw, i)
        if n > (len(raw) - i) // (2 if tag == _R_DICT else 1):
            raise _rec_corrupt("a count beyond its end")
        if tag == _R_DICT:
            d: dict[Any, Any] = {}
            for _ in range(n):
                k, i = _rec_dec(raw, i, depth + 1)
                v, i = _rec_dec(raw, i, depth + 1)
                d[k] = v
            return d, i
        items = []
        for _ in range(n):
            e, i = _rec_dec(raw, i, depth + 1)
            items.append(e)
        return (items if tag == _R_LIST else tuple(items)), i
    raise _rec_corrupt("an unknown tag")


def rec_loads_py(raw: bytes) -> Any:
    """The value of :func:`rec_dumps_py`'s bytes; ValueError if they do not parse."""
    if not isinstance(raw, bytes):
        raise TypeError("rec_loads(raw: bytes)")
    if raw[:1] == bytes((REC_MAGIC,)):
        v, i = _rec_dec(raw, 1, 0)
        if i != len(raw):
            raise _rec_corrupt("bytes follow the value")
        return v
    if raw[:1] == bytes((_REC_PICKLE,)):
        return pickle.loads(raw)
    raise _rec_corrupt("an unknown first byte" if raw else "it is empty")


# the C accelerator (statelog/_ext/workingset.c) when built, else None
C = _ext.load("workingset")
dumps = C.rec_dumps if C is not None else rec_dumps_py
loads = C.rec_loads if C is not None else rec_loads_py

__all__ = ["C", "PROTOCOL", "REC_MAGIC", "dumps", "loads", "rec_dumps_py", "rec_loads_py"]
