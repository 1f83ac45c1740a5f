"""The partitions of the ``statelog`` data source's readers: key-group ranges, as Spark's
``InputPartition`` (Spark accepts only those)."""

from __future__ import annotations

from pyspark.sql.datasource import InputPartition

from statelog.readers import rows


class KeyGroupInputPartition(rows.KeyGroupPartition, InputPartition):
    """Subtask ``index`` of ``count``: key groups ``[start, end]``."""

    def __init__(self, index: int, count: int, start: int, end: int) -> None:
        InputPartition.__init__(self, index)
        rows.KeyGroupPartition.__init__(self, index, count, start, end)


def key_group_partitions(max_parallelism: int, count: int) -> list[InputPartition]:
    """:func:`statelog.readers.rows.key_group_partitions` as Spark's partitions."""
    return [KeyGroupInputPartition(p.index, p.count, p.start, p.end)
            for p in rows.key_group_partitions(max_parallelism, count)]
