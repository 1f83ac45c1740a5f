"""The reader of the change feed of ``format("statelog")`` (``changesFrom``/``changesTo``):
what it holds and how it is planned is :mod:`statelog.readers.changes`."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from statelog.keys.groups import KeyGroupRange
from statelog.readers import options as opt
from statelog.readers.changes import FeedPlan, feed_batches
from statelog.readers.rows import KeyGroupPartition
from statelog.readers.schema import Columns
from statelog.spark.rows import key_group_partitions
from statelog.spark.schema import arrow_schema


class ChangeFeedReader(DataSourceReader):
    def __init__(self, plan: FeedPlan, schema: StructType) -> None:
        self.plan = plan
        self.schema = schema

    def __repr__(self) -> str:
        p = self.plan
        return (f"ChangeFeedReader({p.root!r}, {p.operator!r}, {p.from_id}..{p.to_id}, "
                f"store={p.store!r})")

    def partitions(self) -> list[InputPartition]:
        return key_group_partitions(self.plan.max_parallelism, self.plan.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyGroupPartition)
        job = opt.open_at(self.plan.root, self.plan.store)
        try:
            yield from feed_batches(job, self.plan, KeyGroupRange(partition.start, partition.end),
                                    Columns(arrow_schema(self.schema)))
        finally:
            job.close()
