"""The ``statelog`` PySpark data source: the keyed state of one operator's state at a checkpoint.

::

    spark.read.format("statelog")
        .option("root", "file:///var/lib/job")        # or s3://bucket/prefix (+ store.* options)
        .option("checkpoint", "latest")               # or an id, or "savepoint:NAME"
        .option("operator", "counter").option("state", "count")
        .option("keyType", "string")                  # optional: a typed key column
        .load()

One row per (key, namespace) (per timer for the timer pseudo-states), see docs/spark.md for
the columns. Partitions are key-group ranges (``partitions`` of them, Flink's subtask
ranges for that many subtasks); each partition restores its key groups like a runtime
restore (materialized tables overlapping it, then the changelog tail) and turns the restored
entries into Arrow record batches (:mod:`statelog.readers.state`). With
``changesFrom``/``changesTo`` the source returns the change feed instead
(:mod:`statelog.readers.changes`, read by :class:`statelog.spark.changes.ChangeFeedReader`).

The checkpoint is resolved once, when the DataFrame is created (``latest`` then stays the
same checkpoint for every action on that DataFrame).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter, InputPartition
from pyspark.sql.types import StructType

from statelog.errors import ConfigError
from statelog.readers import options as opt
from statelog.readers.changes import plan_feed
from statelog.readers.restore import restored_backend
from statelog.readers.rows import KeyGroupPartition
from statelog.readers.schema import Columns, parse_key_type
from statelog.readers.state import StatePlan, plan_state, state_batches, state_schema
from statelog.spark.changes import ChangeFeedReader
from statelog.spark.rows import key_group_partitions
from statelog.spark.schema import arrow_schema, spark_schema
from statelog.spark.writer import SavepointDataWriter


class StateReader(DataSourceReader):
    def __init__(self, plan: StatePlan, schema: StructType) -> None:
        self.plan = plan
        self.schema = schema

    def __repr__(self) -> str:
        return f"StateReader({self.plan!r})"

    def partitions(self) -> list[InputPartition]:
        return key_group_partitions(self.plan.max_parallelism, self.plan.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyGroupPartition)
        plan = self.plan
        job = opt.open_at(plan.root, plan.store)
        try:
            meta = opt.resolve(job, plan.target)
            op = opt.operator_of(meta, plan.operator, plan.where)
            backend = restored_backend(job.store, meta, op, plan.state_info.name, partition.index, partition.count)
            yield from state_batches(backend, plan.state_info, parse_key_type(plan.key_type),
                                     meta.max_parallelism, Columns(arrow_schema(self.schema)))
        finally:
            job.close()


class StatelogDataSource(DataSource):
    """``format("statelog")``: state rows, or with ``changesFrom``/``changesTo`` the change feed."""

    @classmethod
    def name(cls) -> str:
        return "statelog"

    def _feed(self) -> bool:
        return opt.get(self.options, "changesFrom") is not None or opt.get(self.options, "changesTo") is not None

    def _plan(self) -> Any:
        plan = getattr(self, "_resolved", None)
        if plan is None:
            plan = plan_feed(self.options) if self._feed() else plan_state(self.options)
            self._resolved = plan
        return plan

    def schema(self) -> StructType:
        plan = self._plan()
        if isinstance(plan, StatePlan):
            return spark_schema(state_schema(plan.state_info, parse_key_type(plan.key_type)))
        return spark_schema(plan.schema())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("statelog")``: one state into a new savepoint (:mod:`statelog.spark.writer`)."""
        if overwrite:
            raise ConfigError('format("statelog") writes a new savepoint and never overwrites: use mode("append") '
                              "(the default errorifexists is fine too) and a savepoint name not in use")
        return SavepointDataWriter(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        plan = self._plan()
        if isinstance(plan, StatePlan):
            return StateReader(plan, schema)
        return ChangeFeedReader(plan, schema)


__all__ = ["StatelogDataSource"]
