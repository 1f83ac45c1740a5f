"""Kafka messages of one ``consume()`` as an Arrow record batch: the key and value columns.

:func:`messages_batch` builds a :class:`pyarrow.RecordBatch` with a ``key`` and a ``value``
column from a list of ``confluent_kafka.Message``. The payloads are joined into one buffer and
the columns are made from it, without a Python object per record where the payload allows:

- keys (``key="bytes"``): a binary array over the joined keys and their offsets; ``"str"``:
  the same buffers as UTF-8 text (checked); a function: ``fn(msg)`` per message;
- values (:func:`value_decoder`): ``"bytes"`` a binary array, ``"str"`` UTF-8 text,
  ``"json"`` one JSON object per value read by :func:`pyarrow.json.read_json` over the joined
  payloads (a struct column), or a fixed-width numpy dtype (``"<i8"``, ``">f8"``, ...) read by
  :func:`numpy.frombuffer` (every value exactly one item wide).

A message without a key (or value) gives a null there (the columns are then built with
``pa.array`` instead of from the joined buffer).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from statelog.errors import ConfigError

ValueDecoder = Callable[[list[Any]], pa.Array]

VALUE_MODES = ("bytes", "str", "json")


def _binary(payloads: list[Any]) -> pa.Array:
    """A binary array of ``payloads`` (bytes or ``None``) from one joined buffer."""
    try:
        data = b"".join(payloads)
    except TypeError:  # a None among them: nulls
        return pa.array(payloads, pa.binary())
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads)), out=offsets[1:])
    if offsets[-1] < (1 << 31) - 1:
        return pa.Array.from_buffers(pa.binary(), len(payloads),
                                     [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.large_binary(), len(payloads),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _text(payloads: list[Any], what: str, hint: str) -> pa.Array:
    arr = _binary(payloads)
    target = pa.large_string() if arr.type == pa.large_binary() else pa.string()
    try:
        return arr.cast(target)
    except pa.ArrowInvalid:
        raise ConfigError(f"a {what} of this batch is not UTF-8 text; {hint}") from None


def _json(values: list[Any]) -> pa.Array:
    if any(v is None for v in values):
        raise ConfigError("a value of this batch is empty (a tombstone); value='json' needs a JSON object per "
                          "record; use value='bytes' and decode yourself")
    try:
        table = pa_json.read_json(io.BytesIO(b"\n".join(values)))
    except pa.ArrowInvalid as exc:
        raise ConfigError(f"the values of this batch are not one JSON object each ({exc}); "
                          "use value='bytes' and decode yourself") from None
    if table.num_rows != len(values):
        raise ConfigError(f"the values of this batch are not one JSON object each ({len(values)} records, "
                          f"{table.num_rows} JSON objects); use value='bytes' and decode yourself")
    return pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], names=table.column_names)


def _fixed(dtype: np.dtype) -> ValueDecoder:
    native = dtype.newbyteorder("=")

    def decode(values: list[Any]) -> pa.Array:
        try:
            data = b"".join(values)
        except TypeError:
            raise ConfigError(f"a value of this batch is empty (a tombstone); value={dtype.str!r} needs "
                              f"{dtype.itemsize} bytes per record") from None
        if len(data) != dtype.itemsize * len(values) or any(len(v) != dtype.itemsize for v in values):
            raise ConfigError(f"a value of this batch is not {dtype.itemsize} bytes wide as value={dtype.str!r} "
                              "needs; use value='bytes' and decode yourself")
        return pa.array(np.frombuffer(data, dtype=dtype).astype(native, copy=False))

    return decode


def value_decoder(value: Any) -> ValueDecoder:
    """The decoder of the ``value`` argument: ``"bytes"``, ``"str"``, ``"json"`` or a fixed-width
    numpy dtype (a ``numpy.dtype`` or its string such as ``">i8"``)."""
    if value == "bytes":
        return _binary
    if value == "str":
        return lambda values: _text(values, "value", "use value='bytes'")
    if value == "json":
        return _json
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "iufb" or isinstance(value, bool):
        raise ConfigError(f"value must be one of {', '.join(VALUE_MODES)} or a fixed-width numpy dtype "
                          f"such as '>i8', got {value!r}")
    return _fixed(dtype)


def key_column(msgs: Sequence[Any], key: Any) -> pa.Array:
    """The ``key`` column of ``msgs`` by the application's ``key`` option."""
    if callable(key):
        return pa.array([key(m) for m in msgs])
    raw = [m.key() for m in msgs]
    if key == "str":
        return _text(raw, "key", "use key='bytes' or a key function")
    return _binary(raw)


def messages_batch(msgs: Sequence[Any], key: Any, decode: ValueDecoder) -> pa.RecordBatch:
    """A record batch of ``msgs`` with the columns ``key`` and ``value``."""
    return pa.RecordBatch.from_arrays([key_column(msgs, key), decode([m.value() for m in msgs])],
                                      names=["key", "value"])
