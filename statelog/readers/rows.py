"""What the state rows and the change rows of the ``statelog`` data source share: key and
namespace columns, key-group partitions, and turning columns into Arrow batches.

Below both :mod:`statelog.readers.state` (state rows) and :mod:`statelog.readers.changes`
(change rows), so that neither imports the other back.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from statelog.errors import ConfigError, SerializationError, StatelogError
from statelog.keys.columns import coerce_keys
from statelog.keys.groups import key_group_range_for_subtask
from statelog.readers.schema import BINARY, STRING, Columns, spark_type_of

BATCH_ROWS = 65_536


# -- shared by state rows and change rows ---------------------------------------------------------


def key_fields(key_type: pa.DataType | None) -> list[pa.Field]:
    """``key`` typed by option ``keyType``, else its string rendering plus ``key_bytes``."""
    if key_type is not None:
        st = spark_type_of(key_type)
        assert st is not None
        return [pa.field("key", st, True)]
    return [pa.field("key", STRING, True), pa.field("key_bytes", BINARY, False)]


def namespace_fields() -> list[pa.Field]:
    return [pa.field("namespace", STRING, True), pa.field("namespace_bytes", BINARY, False)]


def key_sources(key_type: pa.DataType | None) -> dict[str, pa.DataType]:
    return {"key": key_type} if key_type is not None else {}


def to_batch(columns: Columns, cols: dict[str, list[Any]], sources: dict[str, pa.DataType],
             key_type: pa.DataType | None) -> pa.RecordBatch:
    try:
        return columns.batch(cols, sources)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
        if key_type is not None:
            bad = next((k for k in cols["key"] if k is not None and not _fits(k, key_type)), None)
            if bad is not None:
                raise ConfigError(
                    f'option "keyType" is {key_type}, but the state holds key {bad!r} of type '
                    f"{type(bad).__name__}; use a matching keyType or omit it (then key is a string "
                    "rendering and key_bytes the encoded key)"
                ) from None
        raise StatelogError(f"cannot convert restored values to Spark's types: {e}") from None


def _fits(key: Any, t: pa.DataType) -> bool:
    try:
        pa.array([key], type=t)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return False


class KeyGroupPartition:
    """Subtask ``index`` of ``count``: key groups ``[start, end]`` (the Spark readers' partitions
    are :class:`statelog.spark.rows.KeyGroupInputPartition`)."""

    def __init__(self, index: int, count: int, start: int, end: int) -> None:
        self.index, self.count, self.start, self.end = index, count, start, end

    def __repr__(self) -> str:
        return f"KeyGroupPartition({self.index}/{self.count}, key groups {self.start}..{self.end})"


def key_group_partitions(max_parallelism: int, count: int) -> list[KeyGroupPartition]:
    out: list[KeyGroupPartition] = []
    for i in range(count):
        kgr = key_group_range_for_subtask(max_parallelism, count, i)
        out.append(KeyGroupPartition(i, count, kgr.start, kgr.end))
    return out


def typed_keys(ks: list[Any], key_type: pa.DataType) -> list[Any]:
    """Keys as values of option ``keyType`` (keys are stored normalized: ``1.0`` and ``True`` as
    the int ``1``, docs/format.md 3.1), or a ConfigError naming a key that does not fit."""
    try:
        return coerce_keys(ks, key_type)
    except SerializationError as e:
        raise ConfigError(
            f'option "keyType": {e} (keys are stored normalized: True and 1.0 as 1), or omit keyType '
            "(then key is a string rendering and key_bytes the encoded key)"
        ) from None
