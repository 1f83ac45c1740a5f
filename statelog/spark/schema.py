"""Spark's ``StructType`` of a schema written in Spark's Arrow form (:mod:`statelog.readers.schema`).

:func:`spark_schema` is the inverse of PySpark's ``to_arrow_schema(..., timezone="UTC")`` on
the types the readers use, so the record batches of the readers match what Spark expects of
the schema the data sources declare.
"""

from __future__ import annotations

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

_SIMPLE: dict[pa.DataType, DataType] = {
    pa.null(): NullType(), pa.bool_(): BooleanType(), pa.int8(): ByteType(), pa.int16(): ShortType(),
    pa.int32(): IntegerType(), pa.int64(): LongType(), pa.float32(): FloatType(), pa.float64(): DoubleType(),
    pa.string(): StringType(), pa.binary(): BinaryType(), pa.date32(): DateType(),
    pa.timestamp("us", tz="UTC"): TimestampType(), pa.timestamp("us"): TimestampNTZType(),
}


def spark_type(t: pa.DataType) -> DataType:
    """The Spark type whose Arrow form is ``t``."""
    if t in _SIMPLE:
        return _SIMPLE[t]
    if pa.types.is_decimal(t):
        return DecimalType(t.precision, t.scale)
    if pa.types.is_list(t):
        return ArrayType(spark_type(t.value_type), t.value_field.nullable)
    if pa.types.is_map(t):
        return MapType(spark_type(t.key_type), spark_type(t.item_type), t.item_field.nullable)
    if pa.types.is_struct(t):
        return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in t])
    raise TypeError(f"no Spark type has the Arrow form {t}")


def spark_schema(schema: pa.Schema) -> StructType:
    """The ``StructType`` whose Arrow form is ``schema``."""
    return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in schema])


def arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's own Arrow form of ``schema`` (what a data source's record batches must match)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
