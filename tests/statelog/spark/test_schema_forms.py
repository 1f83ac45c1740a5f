"""The readers write Spark's schemas in their Arrow form without PySpark
(:mod:`statelog.readers.schema`); :func:`statelog.spark.schema.spark_schema` turns them into
the ``StructType`` the data sources declare. Spark's own Arrow form of that ``StructType``
(PySpark's ``to_arrow_schema``) must be the readers' schema exactly, or Spark refuses the
record batches."""

from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

from statelog.descriptors import StateInfo, StateKind  # noqa: E402
from statelog.readers.changes import FeedPlan  # noqa: E402
from statelog.readers.state import state_schema  # noqa: E402
from statelog.spark.schema import spark_schema  # noqa: E402
from statelog.types import PICKLE  # noqa: E402

VALUE_TYPES = [
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
    pa.float32(), pa.float64(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.binary(4),
    pa.date32(), pa.date64(), pa.timestamp("ms", tz="Europe/Paris"), pa.timestamp("ns"), pa.decimal128(12, 3),
    pa.decimal256(50, 2), pa.time32("s"), pa.list_(pa.int32()), pa.large_list(pa.string()),
    pa.map_(pa.string(), pa.float64()), pa.struct([("a", pa.int64()), ("b", pa.list_(pa.string()))]), PICKLE,
]
KEY_TYPES = [None, pa.string(), pa.int64(), pa.binary()]


def infos() -> list[StateInfo]:
    out = [StateInfo(name, StateKind.VALUE, pa.int64(), None, None) for name in ("__timers_event",)]
    for i, t in enumerate(VALUE_TYPES):
        out.append(StateInfo(f"v{i}", StateKind.VALUE, t, None, None))
        out.append(StateInfo(f"l{i}", StateKind.LIST, t, None, None))
        out.append(StateInfo(f"m{i}", StateKind.MAP, t, pa.string() if i % 2 else PICKLE, None))
    return out


@pytest.mark.parametrize("key_type", KEY_TYPES, ids=str)
def test_state_and_change_schemas_are_spark_s_arrow_form(key_type: pa.DataType | None) -> None:
    for info in infos():
        schema = state_schema(info, key_type)
        assert to_arrow_schema(spark_schema(schema), timezone="UTC") == schema, info
        feed = FeedPlan(1, 2, "op", info.to_json(), None if key_type is None else str(key_type), 2, 8, (),
                        "file:///x", {})  # type: ignore[arg-type]
        changes = feed.schema()
        assert to_arrow_schema(spark_schema(changes), timezone="UTC") == changes, info
