"""Schemas of state rows and change rows, and the conversion of Python values to Arrow.

The schemas are Spark's: each column has a Spark type, written here in its Arrow form (what
PySpark's ``to_arrow_schema`` makes of it, with ``timestamp`` in UTC), so that this module
needs pyarrow only; :mod:`statelog.spark.schema` turns such a schema into Spark's
``StructType`` for the data sources.

A state's Arrow value type maps to the Spark type with the same values (``int64`` -> ``long``,
``list<T>`` -> ``array<T>``, ``map<K, V>`` -> ``map<K, V>``, ``timestamp[ms, tz]`` ->
``timestamp``, ``uint64`` -> ``decimal(20,0)``, ...). A type Spark cannot hold (e.g.
``time32``, ``decimal`` wider than 38 digits) is rendered as a string (``repr`` of the value).
Pickled values (``statelog.PICKLE``) are rendered with ``repr`` in ``value`` and kept exactly
in ``value_pickle`` (``pickle.dumps(value, protocol=5)`` of the whole value).

Rows are handed to Spark (or DuckDB) as Arrow record batches whose schema is exactly Spark's
Arrow form of the declared schema, so no per-row conversion runs in Spark.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import ConfigError
from statelog.types import PICKLE, ValueType

# -- Spark's types, in their Arrow form -----------------------------------------------------------

LONG, INT, STRING, BINARY = pa.int64(), pa.int32(), pa.string(), pa.binary()


def array_of(element: pa.DataType) -> pa.DataType:
    """Spark's ``array<element>`` (elements may be null)."""
    return pa.list_(pa.field("element", element, True))


def map_of(key: pa.DataType, value: pa.DataType) -> pa.DataType:
    """Spark's ``map<key, value>`` (values may be null)."""
    return pa.map_(pa.field("key", key, False), pa.field("value", value, True))


def spark_type_of(t: pa.DataType) -> pa.DataType | None:
    """The Spark type holding the values of Arrow type ``t``, in its Arrow form (``None``: Spark
    has none): ``uint64`` -> ``decimal(20,0)``, ``timestamp[ms, tz]`` -> ``timestamp[us, UTC]``, ..."""
    pt = pa.types
    simple: list[tuple[Callable[[pa.DataType], bool], pa.DataType]] = [
        (pt.is_null, pa.null()),
        (pt.is_boolean, pa.bool_()),
        (pt.is_int8, pa.int8()),
        (pt.is_int16, pa.int16()),
        (pt.is_int32, INT),
        (pt.is_int64, LONG),
        (pt.is_uint8, pa.int16()),
        (pt.is_uint16, INT),
        (pt.is_uint32, LONG),
        (pt.is_uint64, pa.decimal128(20, 0)),
        (pt.is_float32, pa.float32()),
        (pt.is_float64, pa.float64()),
        (pt.is_string, STRING),
        (pt.is_large_string, STRING),
        (pt.is_binary, BINARY),
        (pt.is_large_binary, BINARY),
        (pt.is_fixed_size_binary, BINARY),
        (pt.is_date, pa.date32()),
    ]
    for check, st in simple:
        if check(t):
            return st
    if pt.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
    if pt.is_decimal(t):
        return pa.decimal128(t.precision, t.scale) if t.precision <= 38 else None
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        elem = spark_type_of(t.value_type)
        return None if elem is None else array_of(elem)
    if pt.is_map(t):
        k, v = spark_type_of(t.key_type), spark_type_of(t.item_type)
        return None if k is None or v is None else map_of(k, v)
    if pt.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        if len(set(names)) != len(names):
            return None
        fields = []
        for i in range(t.num_fields):
            ft = spark_type_of(t.field(i).type)
            if ft is None:
                return None
            fields.append(pa.field(t.field(i).name, ft, True))
        return pa.struct(fields)
    return None


def parse_key_type(name: str | None) -> pa.DataType | None:
    """The Arrow type named by option ``keyType`` (``string``, ``int64``, ``double``, ``binary``, ...)."""
    if name is None or not name.strip():
        return None
    try:
        t = pa.type_for_alias(name.strip())
    except (ValueError, KeyError):
        raise ConfigError(
            f'option "keyType": unknown Arrow type name {name!r}; use e.g. string, int64, int32, '
            "double, bool or binary (omit it for a string rendering of every key plus key_bytes)"
        ) from None
    if spark_type_of(t) is None:
        raise ConfigError(f'option "keyType": Spark has no type for Arrow type {t}')
    return t


# -- value codecs --------------------------------------------------------------------------------


def render(v: Any) -> str | None:
    """The string rendering of a key, namespace or untyped value: ``str`` as is, else ``repr``."""
    if v is None:
        return None
    return v if type(v) is str else repr(v)


@dataclass(frozen=True)
class Codec:
    """How values of one stored value type become a Spark column."""

    spark: pa.DataType  # the Spark type of the column (Arrow form)
    arrow: pa.DataType  # the type Python values are converted with (before the cast to Spark's)
    typed: bool  # False: values are rendered as strings
    pickled: bool

    @staticmethod
    def of(value_type: ValueType) -> Codec:
        if value_type is PICKLE:
            return Codec(STRING, pa.string(), False, True)
        assert isinstance(value_type, pa.DataType)
        st = spark_type_of(value_type)
        if st is None:
            return Codec(STRING, pa.string(), False, False)
        return Codec(st, value_type, True, False)

    def item(self, v: Any) -> Any:
        return v if self.typed else render(v)


def to_array(values: list[Any], source: pa.DataType, target: pa.DataType) -> pa.Array:
    arr = pa.array(values, type=source)
    return arr if arr.type == target else arr.cast(target)


# -- column layouts ------------------------------------------------------------------------------


def _dump(v: Any) -> bytes | None:
    return None if v is None else pickle.dumps(v, protocol=5)


@dataclass(frozen=True)
class ValueLayout:
    """The value columns of one state (state rows and change rows differ for lists and maps)."""

    info: StateInfo
    value: Codec
    user_key: Codec | None

    @staticmethod
    def of(info: StateInfo) -> ValueLayout:
        ukey = Codec.of(info.user_key_type) if info.kind is StateKind.MAP and info.user_key_type is not None \
            else None
        return ValueLayout(info, Codec.of(info.value_type), ukey)

    @property
    def timers(self) -> bool:
        return self.info.name in TIMER_STATES

    @property
    def pickled(self) -> bool:
        return self.value.pickled or (self.user_key is not None and self.user_key.pickled)

    # state rows: the whole entry per (key, namespace)
    def state_fields(self) -> list[pa.Field]:
        if self.timers:
            return [pa.field("timestamp", LONG, False)]
        kind, v = self.info.kind, self.value
        if kind is StateKind.LIST:
            fields = [pa.field("value", array_of(v.spark), False)]
            exp: pa.DataType = array_of(LONG)
        elif kind is StateKind.MAP:
            assert self.user_key is not None
            fields = [pa.field("value", map_of(self.user_key.spark, v.spark), False)]
            exp = map_of(self.user_key.spark, LONG)
        else:
            fields = [pa.field("value", v.spark, True)]
            exp = LONG
        if self.pickled:
            fields.append(pa.field("value_pickle", BINARY, True))
        fields.append(pa.field("expires_ms", exp, True))
        return fields

    # change rows: one record (a list op carries elements, a map op one map entry)
    def change_fields(self) -> list[pa.Field]:
        if self.timers:
            return [pa.field("timestamp", LONG, True)]
        kind, v = self.info.kind, self.value
        fields = []
        if kind is StateKind.MAP:
            assert self.user_key is not None
            fields.append(pa.field("user_key", self.user_key.spark, True))
            if self.user_key.pickled:
                fields.append(pa.field("user_key_pickle", BINARY, True))
        if kind is StateKind.LIST:
            fields.append(pa.field("value", array_of(v.spark), True))
        else:
            fields.append(pa.field("value", v.spark, True))
        if v.pickled:
            fields.append(pa.field("value_pickle", BINARY, True))
        fields.append(pa.field("expires_ms", LONG, True))
        return fields


class Columns:
    """Python lists of one batch of rows, converted to an Arrow record batch of a schema (Spark's
    types in their Arrow form)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = self.arrow = schema
        self.names = schema.names

    def batch(self, cols: dict[str, list[Any]], sources: dict[str, pa.DataType]) -> pa.RecordBatch:
        """``cols``: values per column name; ``sources``: the Arrow type to convert them with
        (default: the target type)."""
        arrays = []
        for name in self.names:
            target = self.arrow.field(name).type
            values = cols[name]
            if isinstance(values, pa.Array):
                arrays.append(values if values.type == target else values.cast(target))
            else:
                arrays.append(to_array(values, sources.get(name, target), target))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow)


def pickle_dump(v: Any) -> bytes | None:
    return _dump(v)
