"""The ``statelog-metadata`` data source: checkpoints, operators, states, subtasks,
materializations and table files of a job root, as small Spark tables.

::

    spark.read.format("statelog-metadata").option("root", ROOT).option("table", "states").load()

``table`` is one of :data:`statelog.readers.metadata.TABLES` (default ``checkpoints``);
``checkpoint`` (an id, ``latest`` or ``savepoint:NAME``) restricts the rows to one checkpoint,
else every retained checkpoint and every savepoint is listed. The rows are those of
:class:`statelog.readers.metadata.Catalog`, which also back ``statelog inspect`` and the
``statelog_*`` views of ``statelog sql``. Schemas: docs/spark.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from statelog.readers import options as opt
from statelog.readers.metadata import SCHEMAS, Catalog, bool_option, table_option
from statelog.store.options import StoreOptions


class MetadataReader(DataSourceReader):
    """Reads one table; ``store`` holds the store options the driver resolved (its ``AWS_*`` env)."""

    def __init__(self, root: str, store: StoreOptions, table: str, checkpoint: str | None,
                 savepoints: bool) -> None:
        self.root, self.store, self.table = root, store, table
        self.checkpoint, self.savepoints = checkpoint, savepoints

    def __repr__(self) -> str:
        return f"MetadataReader({self.root!r}, {self.table!r}, store={self.store!r})"

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        job = opt.open_at(self.root, self.store)
        try:
            yield from Catalog(job, self.checkpoint, self.savepoints).rows(self.table)
        finally:
            job.close()


class StatelogMetadataDataSource(DataSource):
    """``format("statelog-metadata")``: the job root's metadata as tables."""

    @classmethod
    def name(cls) -> str:
        return "statelog-metadata"

    def schema(self) -> str:
        table = table_option(self.options)
        bool_option(self.options, "savepoints", True)
        job = opt.open_job(self.options)  # fail at load() for a wrong root or credentials
        job.close()
        return SCHEMAS[table]

    def reader(self, schema: StructType) -> DataSourceReader:
        root, store = opt.job_store(self.options)
        return MetadataReader(root, store, table_option(self.options), opt.get(self.options, "checkpoint"),
                              bool_option(self.options, "savepoints", True))
