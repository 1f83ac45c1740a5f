"""The streams a job is built of: what each transformation adds to the stream graph.

A :class:`DataStream` is the output of one node of the graph, or the union of several;
``key_by`` makes a :class:`KeyedStream` (keyed process functions and windows apply to it;
on a stream of Arrow record batches keyed by a column, ``process_batches`` and
``aggregate``: :mod:`runtime.api.batches`),
``window`` a :class:`WindowedStream` and ``connect`` of two keyed streams
:class:`ConnectedStreams` (a keyed two-input operator). The environment
(:class:`~runtime.api.environment.StreamExecutionEnvironment`) owns the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pyarrow as pa

from runtime.api.batches import AGGREGATIONS
from runtime.api.functions import KeyedCoProcessFunction, KeyedProcessFunction
from runtime.api.windows import WindowAssigner, WindowOperator
from runtime.connectors.sinks import Sink
from runtime.errors import JobGraphError
from runtime.graph import FORWARD, HASH, InputEdge, StreamGraph, StreamNode
from runtime.network.batch_router import ColumnKey
from runtime.task.batch_operators import BatchAggregateOperator, BatchFunction, BatchProcessOperator
from runtime.task.operators import (
    FilterOperator,
    FlatMapOperator,
    KeyedProcessOperator,
    MapOperator,
    StreamOperator,
)
from statelog.descriptors import AggregateFunction
from statelog.types import PICKLE


class GraphOwner(Protocol):
    """What a stream needs of its environment: the stream graph it adds nodes to."""

    graph: StreamGraph


_INT64 = pa.int64()
Part = tuple[int, str, Callable[[Any], Any] | None]  # (node id, partitioning, key selector)


class DataStream:
    """A stream of records: the output of one node, or the union of several."""

    def __init__(self, env: GraphOwner, parts: tuple[Part, ...]) -> None:
        self.env = env
        self.parts = parts

    def _add(
        self,
        name: str,
        uid: str | None,
        operator: StreamOperator | None = None,
        sink: Sink | None = None,
        extra: Iterable[tuple[Part, int]] = (),
    ) -> StreamNode:
        inputs = [InputEdge(n, p, k, 0) for n, p, k in self.parts]
        inputs += [InputEdge(n, p, k, idx) for (n, p, k), idx in extra]
        return self.env.graph.add(name=name, uid=uid, inputs=inputs, operator=operator, sink=sink)

    def _one(self, op: StreamOperator, name: str, uid: str | None = None) -> DataStream:
        node = self._add(name, uid, op)
        return DataStream(self.env, ((node.id, FORWARD, None),))

    def map(self, fn: Callable[[Any], Any], name: str = "map") -> DataStream:
        return self._one(MapOperator(fn, name), name)

    def filter(self, fn: Callable[[Any], bool], name: str = "filter") -> DataStream:
        return self._one(FilterOperator(fn, name), name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any] | None], name: str = "flat_map") -> DataStream:
        return self._one(FlatMapOperator(fn, name), name)

    def key_by(self, key_selector: Callable[[Any], Any] | str) -> KeyedStream:
        """Partition by key: records with equal keys go to the same subtask (by key group).

        A column name keys by that column: record batches are split by the key groups of
        the column (:mod:`runtime.api.batches`), records by ``record[name]``."""
        if isinstance(key_selector, str) and key_selector:
            key_selector = ColumnKey(key_selector)
        if not callable(key_selector):
            raise JobGraphError(f"key_by needs a callable key selector or a column name, got {key_selector!r}")
        return KeyedStream(self.env, tuple((n, HASH, key_selector) for n, _p, _k in self.parts))

    def union(self, *others: DataStream) -> DataStream:
        parts = list(self.parts)
        for o in others:
            if o.env is not self.env:
                raise JobGraphError("union of streams of different environments")
            parts.extend(o.parts)
        return DataStream(self.env, tuple(parts))

    def connect(self, other: DataStream) -> ConnectedStreams:
        return ConnectedStreams(self, other)

    def sink_to(self, sink: Sink, uid: str, name: str | None = None) -> None:
        if not isinstance(sink, Sink):
            raise JobGraphError(f"sink_to needs a runtime.Sink, got {type(sink).__name__}")
        self._add(name or f"sink:{uid}", uid, sink=sink)


class KeyedStream(DataStream):
    """A stream partitioned by key: keyed process functions and windows apply to it."""

    def process(self, fn: KeyedProcessFunction, uid: str, name: str | None = None) -> DataStream:
        if not isinstance(fn, KeyedProcessFunction):
            raise JobGraphError(f"process needs a KeyedProcessFunction, got {type(fn).__name__}")
        sel = self.parts[0][2]
        assert sel is not None
        name = name or f"process:{uid}"
        return self._one(KeyedProcessOperator(uid, fn, (sel,), name), name, uid)

    def _column(self, what: str) -> ColumnKey:
        sel = self.parts[0][2]
        if not isinstance(sel, ColumnKey) or any(k != sel for _n, _p, k in self.parts):
            raise JobGraphError(f"{what} needs a stream keyed by one column: key_by('column name')")
        return sel

    def process_batches(self, fn: BatchFunction, uid: str, name: str | None = None) -> DataStream:
        """``fn(batch, ctx)`` on every record batch, with the keyed state's batch calls in
        ``ctx`` (:class:`~runtime.api.batches.BatchContext`); it returns a batch, a table,
        an iterable of them, or None (no output)."""
        if not callable(fn):
            raise JobGraphError(f"process_batches needs a callable fn(batch, ctx), got {type(fn).__name__}")
        name = name or f"process-batches:{uid}"
        return self._one(BatchProcessOperator(uid, fn, self._column("process_batches"), name), name, uid)

    def aggregate(self, how: str, uid: str, *, column: str | None = None, value_type: pa.DataType = _INT64,
                  state_name: str | None = None, emit: bool = True, name: str | None = None) -> DataStream:  # fmt: skip
        """``how`` (``"count"``, ``"sum"``, ``"min"``, ``"max"``) of ``column`` per key of a
        stream of record batches, a batch call per batch, in state ``state_name`` (default:
        ``how``; count: an aggregating state with :class:`~statelog.state.batch.CountAggregate`,
        the others a reducing state of ``value_type`` with ``operator.add``/``min``/``max``).
        ``emit``: per batch, the touched keys with their new values."""
        key = self._column("aggregate")
        if how not in AGGREGATIONS:
            raise JobGraphError(f"aggregate: how must be one of {AGGREGATIONS}, got {how!r}")
        if how != "count" and not (isinstance(column, str) and column):
            raise JobGraphError(f"aggregate({how!r}) needs the column to aggregate: column='name'")
        if not isinstance(value_type, pa.DataType):
            raise JobGraphError(f"aggregate: value_type must be a pyarrow DataType, got {value_type!r}")
        name = name or f"aggregate:{uid}"
        op = BatchAggregateOperator(uid, key, how, column, value_type, state_name or how, bool(emit), name)
        return self._one(op, name, uid)

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        if len({id(k) for _n, _p, k in self.parts}) != 1:
            raise JobGraphError("window needs one key selector")
        return WindowedStream(self, assigner)


class WindowedStream:
    def __init__(self, stream: KeyedStream, assigner: WindowAssigner) -> None:
        self.stream = stream
        self.assigner = assigner

    def _build(self, uid: str, name: str | None, **kw: Any) -> DataStream:
        sel = self.stream.parts[0][2]
        assert sel is not None
        name = name or f"window:{uid}"
        op = WindowOperator(uid, sel, self.assigner, name=name, **kw)
        return self.stream._one(op, name, uid)

    def reduce(
        self,
        reduce_fn: Callable[[Any, Any], Any],
        uid: str,
        *,
        window_function: Callable[[Any, Any, Any], Any] | None = None,
        value_type: Any = PICKLE,
        name: str | None = None,
    ) -> DataStream:
        """Fold each window's records with ``reduce_fn``; emit the result (or
        ``window_function(key, window, result)``) when the watermark passes the window."""
        return self._build(uid, name, reduce_fn=reduce_fn, window_function=window_function, value_type=value_type)

    def aggregate(
        self,
        aggregate: AggregateFunction,
        uid: str,
        *,
        window_function: Callable[[Any, Any, Any], Any] | None = None,
        accumulator_type: Any = PICKLE,
        name: str | None = None,
    ) -> DataStream:
        """Aggregate each window's records with ``aggregate`` (create_accumulator/add/get_result)."""
        return self._build(uid, name, aggregate=aggregate, window_function=window_function, value_type=accumulator_type)


class ConnectedStreams:
    """Two keyed streams processed together (``process_element1`` / ``process_element2``)."""

    def __init__(self, first: DataStream, second: DataStream) -> None:
        if not isinstance(first, KeyedStream) or not isinstance(second, KeyedStream):
            raise JobGraphError("connect: key both streams with key_by first (a keyed two-input operator)")
        self.first = first
        self.second = second

    def process(self, fn: KeyedCoProcessFunction, uid: str, name: str | None = None) -> DataStream:
        if not isinstance(fn, KeyedCoProcessFunction):
            raise JobGraphError(f"connect(...).process needs a KeyedCoProcessFunction, got {type(fn).__name__}")
        s1, s2 = self.first.parts[0][2], self.second.parts[0][2]
        assert s1 is not None and s2 is not None
        name = name or f"co-process:{uid}"
        op = KeyedProcessOperator(uid, fn, (s1, s2), name)
        node = self.first._add(name, uid, op, extra=[(p, 1) for p in self.second.parts])
        return DataStream(self.first.env, ((node.id, FORWARD, None),))
