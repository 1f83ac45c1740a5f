"""Streams of Arrow record batches: what a batch job's functions see, and its checks.

A source read with ``env.from_source(source, uid, batches=True)`` emits Arrow record
batches of up to ``batch_rows`` rows (:mod:`runtime.connectors.sources`); ``key_by("column")``
routes each batch to the subtasks owning its keys, split by key group a column at a time
(the hash of the per-record path, so the state lands in the same key groups); then::

    counts = ReducingStateDescriptor("sum", pa.int64(), reduce_fn=operator.add)

    def add_amounts(batch, ctx):
        ctx.get_state(counts).add_many(batch["user"], batch["amount"])
        return batch.select(["user", "amount"])      # a batch, a table, several, or None

    (env.from_source(ParquetSource(IN), uid="events", batches=True)
        .key_by("user")
        .process_batches(add_amounts, uid="sums")
        .sink_to(FileSink(OUT), uid="out"))

or, for the common aggregations, ``.key_by("user").aggregate("sum", uid="sums", column="amount")``
(:data:`AGGREGATIONS`). A batch is one element of a channel: barriers and watermarks go
between batches, so checkpoints, restores (at any parallelism) and exactly-once output work
as for records. Sinks write or collect a batch's rows.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from runtime.errors import JobGraphError
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from statelog.state.batch_reductions import CountAggregate

if TYPE_CHECKING:
    from runtime.connectors.sources import WatermarkStrategy
    from statelog.state.backend import KeyedStateBackend

DEFAULT_BATCH_ROWS = 65_536  # rows per record batch a source reads (from_source(batches=True))
MAX_BATCH_ROWS = 1 << 24
AGGREGATIONS = ("count", "sum", "min", "max")  # KeyedStream.aggregate


def check_batch_source(batches: Any, batch_rows: Any, watermarks: WatermarkStrategy | None) -> int | None:
    """``from_source``'s batch settings: the rows per batch, or None (records)."""
    if not isinstance(batches, bool):
        raise JobGraphError(f"from_source batches must be True or False, got {batches!r}")
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or not 1 <= batch_rows <= MAX_BATCH_ROWS:
        raise JobGraphError(f"from_source batch_rows must be an int in [1, {MAX_BATCH_ROWS}], got {batch_rows!r}")
    if not batches:
        return None
    if watermarks is not None:
        raise JobGraphError(
            "from_source(batches=True) with watermarks: record batches carry no event timestamps; "
            "read records (batches=False) for event-time windows, or leave watermarks unset"
        )
    return batch_rows


def aggregate_descriptor(how: str, state_name: str, value_type: pa.DataType) -> StateDescriptor:
    """The keyed state of ``KeyedStream.aggregate(how)``: the descriptor a per-record job
    declares for the same aggregation (so both paths keep the same state)."""
    if how == "count":
        return AggregatingStateDescriptor(state_name, pa.int64(), aggregate=CountAggregate())
    reduce_fn = {"sum": operator.add, "min": min, "max": max}[how]
    return ReducingStateDescriptor(state_name, value_type, reduce_fn=reduce_fn)


class BatchContext:
    """What ``process_batches``' function gets with each batch: the operator's keyed state
    (use its batch calls with the batch's keys: ``get_many``, ``put_many``, ``delete_many``,
    ``add_many``; the keys are the rows' values of the key column, all owned by this
    subtask), the key column's name and the subtask."""

    def __init__(self, backend: KeyedStateBackend, subtask: int, parallelism: int, uid: str, key: str) -> None:
        self._backend = backend
        self.subtask_index = subtask
        self.parallelism = parallelism
        self.operator_uid = uid
        self.key_column = key

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The keyed state of ``descriptor`` (restored on recovery)."""
        return self._backend.get_state(descriptor)

    def keys(self, batch: pa.RecordBatch) -> pa.Array:
        """The key column of ``batch``."""
        return batch.column(self.key_column)

    @property
    def backend(self) -> KeyedStateBackend:
        return self._backend
