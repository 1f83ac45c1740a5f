"""Jobs over Arrow record batches (:mod:`runtime.api.batches`) and their per-record twins.

Both jobs read the same events ``{"k": key, "v": value}`` (a generator, or Parquet files of
the same rows) and keep the same state under the same uids:

* ``kinds``: a count, a sum, a min, a max (aggregating/reducing states), a count kept as a
  value state (read-modify-write: ``get_many``/``put_many``) and the list of values per key;
  the batch job with ``process_batches`` and the batch calls, the per-record job with a
  keyed process function. Both pass every event on to the ``out`` sink.
* ``agg-count``, ``agg-sum``, ``agg-min``, ``agg-max``: ``KeyedStream.aggregate`` in the
  batch job, the same state (``aggregate_descriptor``) updated record by record in the other.

:func:`final_state` reads every state of a checkpoint, per subtask, for comparing them.
Everything is at module level: the job graphs pickle by reference into the workers.
"""

from __future__ import annotations

import operator
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import statelog
from runtime import (
    CollectSink,
    FileSink,
    GeneratorSource,
    KeyedProcessFunction,
    ParquetSource,
    StreamExecutionEnvironment,
)
from runtime.api.batches import AGGREGATIONS, BatchContext, aggregate_descriptor
from runtime.connectors.sources import Source
from statelog import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statelog.state.batch_reductions import CountAggregate

KEYS = 97
SPLITS = 4
COUNT = AggregatingStateDescriptor("count", pa.int64(), aggregate=CountAggregate())
SUM = ReducingStateDescriptor("sum", pa.int64(), reduce_fn=operator.add)
MIN = ReducingStateDescriptor("min", pa.int64(), reduce_fn=min)
MAX = ReducingStateDescriptor("max", pa.int64(), reduce_fn=max)
SEEN = ValueStateDescriptor("seen", pa.int64(), default=0)
VALUES = ListStateDescriptor("values", pa.int64())
KIND_STATES = (COUNT, SUM, MIN, MAX, SEEN, VALUES)
AGG_UIDS = {f"agg-{how}": how for how in AGGREGATIONS}


def make_event(split: int, i: int) -> dict[str, int]:
    h = zlib.crc32(f"{split}:{i}".encode())
    return {"k": h % KEYS, "v": (h >> 8) % 1000 - 300}


def events(per_split: int, splits: int = SPLITS) -> list[dict[str, int]]:
    return [make_event(s, i) for s in range(splits) for i in range(per_split)]


def write_parquet(directory: Path, per_split: int, splits: int = SPLITS, row_group: int = 700) -> None:
    """The generator's events of each split as one Parquet file (several row groups)."""
    directory.mkdir(parents=True, exist_ok=True)
    for s in range(splits):
        rows = [make_event(s, i) for i in range(per_split)]
        pq.write_table(pa.Table.from_pylist(rows), directory / f"events-{s}.parquet", row_group_size=row_group)


# -- the batch job -------------------------------------------------------------------------------


class BatchKinds:
    """``process_batches``' function keeping every state kind of ``kinds`` with batch calls."""

    def open(self, ctx: BatchContext) -> None:
        self.states = {d.name: ctx.get_state(d) for d in KIND_STATES}

    def __call__(self, batch: pa.RecordBatch, ctx: BatchContext) -> pa.RecordBatch:
        keys, values = ctx.keys(batch), batch.column("v")
        st = self.states
        st["count"].add_many(keys)
        for name in ("sum", "min", "max"):
            st[name].add_many(keys, values)
        st["values"].add_many(keys, values)
        per_key = pa.table({"k": keys}).group_by("k").aggregate([("k", "count")])
        uniq = per_key.column("k").combine_chunks()
        seen = st["seen"]
        seen.put_many(uniq, pc.add(seen.get_many(uniq), per_key.column("k_count").combine_chunks()))
        return batch


def build_batch(env: StreamExecutionEnvironment, source: Source, out: Path | None, batch_rows: int = 500) -> None:
    """The batch job: ``kinds`` into a file sink at ``out`` (a collect sink ``out`` when None),
    the aggregates into a collect sink ``agg-out``."""
    keyed = env.from_source(source, uid="events", batches=True, batch_rows=batch_rows).key_by("k")
    kinds = keyed.process_batches(BatchKinds(), uid="kinds")
    kinds.sink_to(FileSink(out) if out is not None else CollectSink(), uid="out")
    aggs = [keyed.aggregate(how, uid=uid, column=None if how == "count" else "v") for uid, how in AGG_UIDS.items()]
    aggs[0].union(*aggs[1:]).sink_to(CollectSink(), uid="agg-out")


# -- the per-record job --------------------------------------------------------------------------


def key_of(e: dict[str, int]) -> int:
    return e["k"]


class RecordKinds(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.states = {d.name: ctx.get_state(d) for d in KIND_STATES}

    def process_element(self, e: dict[str, int], ctx: Any) -> Any:
        st, v = self.states, e["v"]
        st["count"].add(v)
        for name in ("sum", "min", "max"):
            st[name].add(v)
        st["values"].add(v)
        st["seen"].update(st["seen"].value() + 1)
        yield e


class RecordAggregate(KeyedProcessFunction):
    def __init__(self, how: str) -> None:
        self.how = how

    def open(self, ctx: Any) -> None:
        self.state = ctx.get_state(aggregate_descriptor(self.how, self.how, pa.int64()))

    def process_element(self, e: dict[str, int], ctx: Any) -> None:
        self.state.add(e["v"])


def build_records(env: StreamExecutionEnvironment, source: Source, out: Path | None) -> None:
    keyed = env.from_source(source, uid="events").key_by(key_of)
    kinds = keyed.process(RecordKinds(), uid="kinds")
    kinds.sink_to(FileSink(out) if out is not None else CollectSink(), uid="out")
    aggs = [keyed.process(RecordAggregate(how), uid=uid) for uid, how in AGG_UIDS.items()]
    aggs[0].union(*aggs[1:]).sink_to(CollectSink(), uid="agg-out")


def generator(per_split: int, rate: float | None = None) -> GeneratorSource:
    return GeneratorSource(make_event, per_split, splits=SPLITS, records_per_s=rate)


def parquet(directory: Path, row: str = "dict") -> ParquetSource:
    return ParquetSource(directory, "events-*.parquet", row=row)


# -- reading the state back ----------------------------------------------------------------------


def final_state(root: str, checkpoint: int, parallelism: int) -> dict[tuple[str, str], dict[int, Any]]:
    """``{(uid, state): {key: value}}`` of a checkpoint, read subtask by subtask at
    ``parallelism`` (list values sorted: the order of values of one key from different
    source subtasks is not defined); a key read by two subtasks fails."""
    out: dict[tuple[str, str], dict[int, Any]] = {}
    with statelog.open(root, create=False) as job:
        for uid, descriptors in [("kinds", KIND_STATES)] + [(u, (aggregate_descriptor(h, h, pa.int64()),))
                                                              for u, h in AGG_UIDS.items()]:  # fmt: skip
            for i in range(parallelism):
                b = job.backend(uid, subtask=i, parallelism=parallelism, restore=checkpoint, changelog=False)
                try:
                    for d in descriptors:
                        b.get_state(d)
                        got = out.setdefault((uid, d.name), {})
                        for k, _ns, v in b.entries(d.name):
                            assert k not in got, f"{uid}/{d.name}: key {k} in two subtasks"
                            got[k] = sorted(v) if isinstance(v, list) else v
                finally:
                    b.close()
    return out


def expected_state(rows: list[dict[str, int]]) -> dict[tuple[str, str], dict[int, Any]]:
    """What both jobs' states hold after ``rows`` (plain Python)."""
    vals: dict[int, list[int]] = {}
    for r in rows:
        vals.setdefault(r["k"], []).append(r["v"])
    count = {k: len(v) for k, v in vals.items()}
    total = {k: sum(v) for k, v in vals.items()}
    lo = {k: min(v) for k, v in vals.items()}
    hi = {k: max(v) for k, v in vals.items()}
    return {("kinds", "count"): count, ("kinds", "sum"): total, ("kinds", "min"): lo, ("kinds", "max"): hi,
            ("kinds", "seen"): dict(count), ("kinds", "values"): {k: sorted(v) for k, v in vals.items()},
            ("agg-count", "count"): dict(count), ("agg-sum", "sum"): dict(total),
            ("agg-min", "min"): dict(lo), ("agg-max", "max"): dict(hi)}  # fmt: skip


def rows_before(sources: dict[str, Any]) -> list[dict[str, int]]:
    """The generator's events before the positions of a checkpoint's ``events`` source."""
    return [make_event(int(split), i) for split, pos in sources["events"].items() for i in range(pos["next"])]


def as_counter(rows: list[dict[str, int]]) -> Counter[tuple[int, int]]:
    return Counter((r["k"], r["v"]) for r in rows)
