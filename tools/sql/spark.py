"""The Spark engine of ``statelog sql`` and ``statelog inspect`` (``--engine spark``).

The views of a :class:`ViewPlan` become temporary views of the ``statelog`` and
``statelog-metadata`` data sources (:func:`register_views`); a query returns its columns and
first rows with timestamps as aware UTC datetimes, as DuckDB returns them
(:func:`spark_query`); ``inspect`` counts rows with one Spark job per state
(:func:`row_counter`). The session itself comes from :mod:`tools.cli.spark_session`.
PySpark and :mod:`statelog.spark` are imported inside the functions (the ``spark`` extra).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from tools.sql.views import ViewPlan


def register_views(spark: Any, plan: ViewPlan, options: dict[str, Any], key_type: str | None,
                   only: Sequence[str] | None = None) -> None:
    """Create the temporary views of ``plan`` in ``spark`` (``only``: just these names)."""
    from statelog.readers import options as opt
    from statelog.spark import METADATA_FORMAT, STATE_FORMAT

    spark_opts = {"root": plan.root, **opt.to_spark_options(options)}
    if key_type:
        spark_opts["keyType"] = key_type
    wanted = set(only) if only is not None else set(plan.names)
    for name, (uid, state) in plan.states.items():
        if name in wanted:
            spark.read.format(STATE_FORMAT).options(**spark_opts).option("checkpoint", plan.target) \
                .option("operator", uid).option("state", state).load().createOrReplaceTempView(name)
    for name, (uid, state) in plan.changes.items():
        if name in wanted:
            spark.read.format(STATE_FORMAT).options(**spark_opts).option("changesFrom", plan.changes_from) \
                .option("changesTo", plan.target).option("operator", uid).option("state", state).load() \
                .createOrReplaceTempView(name)
    for name, table in plan.metadata.items():
        if name in wanted:
            spark.read.format(METADATA_FORMAT).options(**{k: v for k, v in spark_opts.items() if k != "keyType"}) \
                .option("table", table).load().createOrReplaceTempView(name)


def spark_query(spark: Any, plan: ViewPlan, options: dict[str, Any], key_type: str | None, query: str,
                names: Sequence[str], max_rows: int) -> tuple[list[str], list[tuple]]:
    """Columns and the first ``max_rows + 1`` rows of ``query`` on Spark (timestamps in UTC).
    The temporary views are dropped afterwards (a session of the caller is left as it was)."""
    try:
        register_views(spark, plan, options, key_type, names)
        df = spark.sql(query)
        rows = df.limit(max_rows + 1).collect()
        types = [f.dataType for f in df.schema.fields]
        return list(df.columns), [tuple(_utc(v, t) for v, t in zip(r, types, strict=True)) for r in rows]
    finally:
        for name in names:
            spark.catalog.dropTempView(name)


def _utc(value: Any, spark_type: Any) -> Any:
    """A value of a Spark ``timestamp`` (PySpark returns naive local times) as an aware UTC
    datetime, in nested values too: DuckDB returns them so, and both print alike."""
    from pyspark.sql.types import ArrayType, MapType, StructType, TimestampType

    if value is None:
        return None
    if isinstance(spark_type, TimestampType) and isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC)
    if isinstance(spark_type, ArrayType):
        return [_utc(v, spark_type.elementType) for v in value]
    if isinstance(spark_type, MapType):
        return {_utc(k, spark_type.keyType): _utc(v, spark_type.valueType) for k, v in value.items()}
    if isinstance(spark_type, StructType):
        return {f.name: _utc(value[f.name], f.dataType) for f in spark_type.fields}
    return value


def row_counter(spark: Any, root: str, options: dict[str, Any]) -> Any:
    """Rows of a state view on Spark (one count job per state)."""
    from statelog.readers import options as opt
    from statelog.spark import STATE_FORMAT

    def count(uid: str, state: str, target: str) -> int:
        return int(spark.read.format(STATE_FORMAT).options(root=root, **opt.to_spark_options(options))
                   .option("checkpoint", target).option("operator", uid).option("state", state).load().count())

    return count
