"""Spark schemas of state rows and change rows, and the conversion of Python values to Arrow.

A state's Arrow value type maps to the Spark type with the same values (``int64`` -> ``long``,
``list<T>`` -> ``array<T>``, ``map<K, V>`` -> ``map<K, V>``, ``timestamp[ms, tz]`` ->
``timestamp``, ``uint64`` -> ``decimal(20,0)``, ...). A type Spark cannot hold (e.g.
``time32``, ``decimal`` wider than 38 digits) is rendered as a string (``repr`` of the value).
Pickled values (``statelog.PICKLE``) are rendered with ``repr`` in ``value`` and kept exactly
in ``value_pickle`` (``pickle.dumps(value, protocol=5)`` of the whole value).

Rows are handed to Spark as Arrow record batches whose schema is exactly Spark's Arrow
form of the declared schema (:func:`arrow_schema`), so no per-row conversion runs in Spark.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from statelog.changelog.format import TIMER_STATES
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import ConfigError
from statelog.types import PICKLE, ValueType

# -- Arrow types to Spark types ------------------------------------------------------------------


def spark_type_of(t: pa.DataType) -> DataType | None:
    """The Spark type holding the values of Arrow type ``t`` (``None``: Spark has none)."""
    pt = pa.types
    simple: list[tuple[Callable[[pa.DataType], bool], DataType]] = [
        (pt.is_null, NullType()),
        (pt.is_boolean, BooleanType()),
        (pt.is_int8, ByteType()),
        (pt.is_int16, ShortType()),
        (pt.is_int32, IntegerType()),
        (pt.is_int64, LongType()),
        (pt.is_uint8, ShortType()),
        (pt.is_uint16, IntegerType()),
        (pt.is_uint32, LongType()),
        (pt.is_uint64, DecimalType(20, 0)),
        (pt.is_float32, FloatType()),
        (pt.is_float64, DoubleType()),
        (pt.is_string, StringType()),
        (pt.is_large_string, StringType()),
        (pt.is_binary, BinaryType()),
        (pt.is_large_binary, BinaryType()),
        (pt.is_fixed_size_binary, BinaryType()),
        (pt.is_date, DateType()),
    ]
    for check, st in simple:
        if check(t):
            return st
    if pt.is_timestamp(t):
        return TimestampType() if t.tz is not None else TimestampNTZType()
    if pt.is_decimal(t):
        return DecimalType(t.precision, t.scale) if t.precision <= 38 else None
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        elem = spark_type_of(t.value_type)
        return None if elem is None else ArrayType(elem, True)
    if pt.is_map(t):
        k, v = spark_type_of(t.key_type), spark_type_of(t.item_type)
        return None if k is None or v is None else MapType(k, v, True)
    if pt.is_struct(t):
        names = [t.field(i).name for i in range(t.num_fields)]
        if len(set(names)) != len(names):
            return None
        fields = []
        for i in range(t.num_fields):
            ft = spark_type_of(t.field(i).type)
            if ft is None:
                return None
            fields.append(StructField(t.field(i).name, ft, True))
        return StructType(fields)
    return None


def arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's own Arrow form of ``schema`` (what a data source's record batches must match)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


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

    spark: DataType
    arrow: pa.DataType  # the type Python values are converted with (before the cast to Spark's)
    typed: bool  # False: values are rendered as strings
    pickled: bool

    @staticmethod
    def of(value_type: ValueType) -> Codec:
        if value_type is PICKLE:
            return Codec(StringType(), pa.string(), False, True)
        assert isinstance(value_type, pa.DataType)
        st = spark_type_of(value_type)
        if st is None:
            return Codec(StringType(), pa.string(), False, False)
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
    def state_fields(self) -> list[StructField]:
        if self.timers:
            return [StructField("timestamp", LongType(), False)]
        kind, v = self.info.kind, self.value
        if kind is StateKind.LIST:
            fields = [StructField("value", ArrayType(v.spark, True), False)]
            exp: DataType = ArrayType(LongType(), True)
        elif kind is StateKind.MAP:
            assert self.user_key is not None
            fields = [StructField("value", MapType(self.user_key.spark, v.spark, True), False)]
            exp = MapType(self.user_key.spark, LongType(), True)
        else:
            fields = [StructField("value", v.spark, True)]
            exp = LongType()
        if self.pickled:
            fields.append(StructField("value_pickle", BinaryType(), True))
        fields.append(StructField("expires_ms", exp, True))
        return fields

    # change rows: one record (a list op carries elements, a map op one map entry)
    def change_fields(self) -> list[StructField]:
        if self.timers:
            return [StructField("timestamp", LongType(), True)]
        kind, v = self.info.kind, self.value
        fields = []
        if kind is StateKind.MAP:
            assert self.user_key is not None
            fields.append(StructField("user_key", self.user_key.spark, True))
            if self.user_key.pickled:
                fields.append(StructField("user_key_pickle", BinaryType(), True))
        if kind is StateKind.LIST:
            fields.append(StructField("value", ArrayType(v.spark, True), True))
        else:
            fields.append(StructField("value", v.spark, True))
        if v.pickled:
            fields.append(StructField("value_pickle", BinaryType(), True))
        fields.append(StructField("expires_ms", LongType(), True))
        return fields


class Columns:
    """Python lists of one batch of rows, converted to an Arrow record batch of a Spark schema."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.arrow = arrow_schema(schema)
        self.names = schema.fieldNames()

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
