"""Keyed operators of streams of Arrow record batches (:mod:`runtime.api.batches`).

Both receive the batches a ``key_by("column")`` edge routed to their subtask (every row's
key is in the subtask's key groups) and keep their state in the operator's keyed backend
through its batch calls, which append one changelog block part per call:

* :class:`BatchProcessOperator`: ``fn(batch, ctx)`` per batch (``process_batches``); its
  outputs go on as they are (a table as its batches);
* :class:`BatchAggregateOperator`: count, sum, min or max per key (``aggregate``), one
  ``add_many`` per batch; it emits, per batch, the touched keys with their new values.

A disk-backed working set needs no prefetch here: the batch calls read a batch's keys in
one batched read themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from runtime.api.batches import BatchContext, aggregate_descriptor
from runtime.errors import RuntimeJobError
from runtime.network.batch_router import ColumnKey
from runtime.task.operators import KeyedOperator, Output

BatchFunction = Callable[[pa.RecordBatch, BatchContext], Any]


def _not_a_batch(op: KeyedOperator, value: Any) -> RuntimeJobError:
    return RuntimeJobError(
        f"{op.describe()} takes Arrow record batches, got a {type(value).__name__}: read the source "
        "with env.from_source(..., batches=True), or use process(...) for a stream of records"
    )


def emit_batches(out: Output, result: Any) -> None:
    """Emit a batch function's result: a record batch, a table (its batches), an iterable
    of them, or None."""
    if result is None:
        return
    if isinstance(result, pa.RecordBatch):
        if result.num_rows:
            out.emit(result, None)
        return
    if isinstance(result, pa.Table):
        result = result.to_batches()
    for item in result if isinstance(result, Iterable) else (result,):
        if isinstance(item, pa.Table):
            emit_batches(out, item)
        elif not isinstance(item, pa.RecordBatch) or item.num_rows:
            out.emit(item, None)


class BatchProcessOperator(KeyedOperator):
    """Runs ``fn(batch, ctx)`` on every batch (``KeyedStream.process_batches``); ``fn.open(ctx)``
    first when ``fn`` has it."""

    name = "process-batches"

    def __init__(self, uid: str, fn: BatchFunction, key: ColumnKey, name: str | None = None) -> None:
        super().__init__(uid, (key,), name)
        self.fn = fn
        self.key = key.name

    def open(self) -> None:
        self.bctx = BatchContext(self.backend, self.ctx.subtask, self.ctx.parallelism, self.uid or "", self.key)
        opener = getattr(self.fn, "open", None)
        if callable(opener):
            opener(self.bctx)

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        if type(value) is not pa.RecordBatch:
            raise _not_a_batch(self, value)
        emit_batches(self.out, self.fn(value, self.bctx))

    def prefetch(self, records: list[tuple[Any, Any]], input_index: int) -> None:
        pass  # the batch calls read their keys in one batched read


class BatchAggregateOperator(KeyedOperator):
    """``KeyedStream.aggregate``: ``how`` (count, sum, min or max) of column ``column`` per
    key in the state ``state_name``; ``emit``: per batch, a batch of the touched keys and
    their new values (columns: the key column and ``state_name``)."""

    name = "aggregate"

    def __init__(self, uid: str, key: ColumnKey, how: str, column: str | None, value_type: pa.DataType,
                 state_name: str, emit: bool, name: str | None = None) -> None:  # fmt: skip
        super().__init__(uid, (key,), name)
        self.key, self.how, self.column = key.name, how, column
        self.descriptor = aggregate_descriptor(how, state_name, value_type)
        self.emit = emit

    def open(self) -> None:
        self.state = self.backend.get_state(self.descriptor)

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        if type(value) is not pa.RecordBatch:
            raise _not_a_batch(self, value)
        names = value.schema.names
        for col in (self.key, self.column):
            if col is not None and col not in names:
                raise RuntimeJobError(f"{self.describe()}: the batch has no column {col!r} (its columns: {names})")
        keys = value.column(self.key)
        if self.how == "count":
            self.state.add_many(keys)
        else:
            self.state.add_many(keys, value.column(self.column))
        if self.emit and value.num_rows:
            touched = pc.unique(keys)
            self.out.emit(pa.record_batch([touched, self.state.get_many(touched)],
                                          names=[self.key, self.descriptor.name]), None)  # fmt: skip

    def prefetch(self, records: list[tuple[Any, Any]], input_index: int) -> None:
        pass  # add_many reads its keys in one batched read
