"""The state rows of the ``statelog`` data source: one operator's state at a checkpoint.

One row per (key, namespace) (per timer for the timer pseudo-states), see docs/spark.md for
the columns. :func:`plan_state` resolves the options once (``latest`` then stays the same
checkpoint); a reader restores the key groups of one partition like a runtime restore
(:func:`statelog.readers.restore.restored_backend`: materialized tables overlapping it,
then the changelog tail) and :func:`state_batches` turns the restored entries into Arrow
record batches of :func:`state_schema`. The Spark data source is
:class:`statelog.spark.datasource.StatelogDataSource`; ``statelog sql`` on DuckDB reads the
same batches in-process (pyarrow only: this module imports nothing of PySpark).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statelog.arrays import integer_numpy, numpy_integers
from statelog.compute import pc
from statelog.descriptors import StateInfo, StateKind
from statelog.keys.batch import encode_keys, int64_keys, key_groups_of
from statelog.keys.encoding import subclassed_key_types
from statelog.readers import options as opt
from statelog.readers.restore import (
    namespace_tables,
    split_entries,
    timer_entries,
)
from statelog.readers.rows import (
    BATCH_ROWS,
    key_fields,
    key_sources,
    namespace_fields,
    to_batch,
    typed_keys,
)
from statelog.readers.schema import (
    INT,
    Columns,
    ValueLayout,
    parse_key_type,
    pickle_dump,
    render,
)
from statelog.store.options import StoreOptions

# -- state rows ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatePlan:
    """What ``schema()`` resolved (pickled with the data source to the readers).

    ``store`` holds the store options the driver resolved (with its ``AWS_*`` environment):
    the executors open the store with them, whatever their own environment.
    """

    root: str
    store: StoreOptions
    target: str  # a checkpoint id, or "savepoint:NAME"
    where: str
    operator: str
    info: dict[str, Any]  # StateInfo.to_json() (PICKLE survives only as JSON)
    key_type: str | None
    partitions: int
    max_parallelism: int

    @property
    def state_info(self) -> StateInfo:
        return StateInfo.from_json(self.info)


def plan_state(options: Mapping[str, str]) -> StatePlan:
    uid = opt.require(options, "operator", "the uid of the operator whose state to read")
    name = opt.require(options, "state", "the state name (or __timers_event / __timers_processing)")
    key_type_name = opt.get(options, "keyType")
    parse_key_type(key_type_name)
    root, store = opt.job_store(options)
    job = opt.open_at(root, store)
    try:
        which = opt.get(options, "checkpoint")
        meta = opt.resolve(job, which)
        target = which.strip() if which and which.strip().startswith("savepoint:") else str(meta.checkpoint_id)
        where = opt.describe(meta, target[len("savepoint:"):] if target.startswith("savepoint:") else None)
        op = opt.operator_of(meta, uid, where)
        info = opt.state_of(op, name, where)
        partitions = opt.parse_partitions(options, max(2, op.parallelism), meta.max_parallelism)
        return StatePlan(root, store, target, where, uid, info.to_json(), key_type_name, partitions,
                         meta.max_parallelism)
    finally:
        job.close()


def state_schema(info: StateInfo, key_type: pa.DataType | None) -> pa.Schema:
    """The state rows' columns (Spark's types in their Arrow form)."""
    fields = [pa.field("key_group", INT, False), *key_fields(key_type), *namespace_fields()]
    fields += ValueLayout.of(info).state_fields()
    return pa.schema(fields)


def state_batches(backend: Any, info: StateInfo, key_type: pa.DataType | None, maxp: int,
                  columns: Columns, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the state rows of a restored backend.

    Column-wise per namespace: the keys and entries of a namespace table are taken as lists,
    keys are encoded and their key groups computed a column at a time (:mod:`statelog.keys.batch`).
    """
    layout = ValueLayout.of(info)
    sources = key_sources(key_type)
    if layout.timers:
        rows = list(timer_entries(backend, info.name))
        for s in range(0, len(rows), batch_rows):
            chunk = rows[s:s + batch_rows]
            ks, nss, nsbs, tss = (list(c) for c in zip(*chunk, strict=True))
            cols = _key_cells(ks, key_type, maxp)
            cols.update({"namespace": [render(ns) for ns in nss], "namespace_bytes": nsbs, "timestamp": tss})
            yield to_batch(columns, cols, sources, key_type)
        return
    v, uk = layout.value, layout.user_key
    kind = info.kind
    if kind is StateKind.LIST:
        sources["value"] = pa.list_(v.arrow)
    elif kind is StateKind.MAP:
        assert uk is not None
        sources["value"] = pa.map_(uk.arrow, v.arrow)
        sources["expires_ms"] = pa.map_(uk.arrow, pa.int64())
    else:
        sources["value"] = v.arrow
    for nsb, ns, table in namespace_tables(backend, info):
        keys = list(table)
        entries = list(table.values())
        shown = render(ns)
        for s in range(0, len(keys), batch_rows):
            ks = keys[s:s + batch_rows]
            values, exps = split_entries(info, entries[s:s + batch_rows])
            n = len(ks)
            cols = _key_cells(ks, key_type, maxp)
            cols["namespace"] = pa.nulls(n, pa.string()) if shown is None else pa.repeat(pa.scalar(shown, pa.string()), n)
            cols["namespace_bytes"] = pa.repeat(pa.scalar(nsb, pa.binary()), n)
            _value_cells(layout, values, exps, n, cols)
            yield to_batch(columns, cols, sources, key_type)


def _key_cells(ks: list[Any], key_type: pa.DataType | None, maxp: int) -> dict[str, Any]:
    """The key columns of keys ``ks``: their encodings and key groups a column at a time
    (:mod:`statelog.keys.batch`: int64 keys and short strings with numpy)."""
    ints = None
    uniform = _uniform_keys(ks)
    if uniform is not None and uniform.type == pa.int64():
        ints = integer_numpy(uniform)
        kbs = int64_keys(ints)
    elif uniform is not None:
        _, kbs = encode_keys(uniform)
    else:
        _, kbs = encode_keys(ks)
    cols: dict[str, Any] = {"key_group": numpy_integers(key_groups_of(kbs, maxp))}
    if key_type is not None:
        cols["key"] = typed_keys(ks, key_type)
    else:
        cols["key"] = numpy_integers(ints).cast(pa.string()) if ints is not None else render_all(ks)
        cols["key_bytes"] = kbs
    return cols


def _uniform_keys(ks: list[Any]) -> pa.Array | None:
    """The keys as an int64 or a string array when every one is a plain ``int`` (in int64) or
    every one a plain ``str``, else ``None``. One pass in C over the key objects (Arrow's type
    inference: a bool or a float beside ints, or a mix, is not inferred as int64), instead of
    a pass for their types and another for their values: at 10^6 keys each pass costs about
    0.25 s of cache misses. A registered key type that subclasses int or str would be inferred
    as one of them: then keys take the key-by-key path."""
    if not ks or subclassed_key_types():
        return None
    try:
        arr = pa.array(ks)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed types, beyond int64
        return None
    if arr.null_count or arr.type not in (pa.int64(), pa.string()):
        return None
    return arr


def render_all(ks: list[Any]) -> list[Any]:
    """:func:`render` of every key (int and str keys in bulk)."""
    if all(type(k) is str for k in ks):
        return ks
    if all(type(k) is int for k in ks):
        try:
            return pa.array(ks, pa.int64()).cast(pa.string()).to_pylist()
        except (pa.ArrowInvalid, OverflowError):
            pass
    return [render(k) for k in ks]


_U32 = {n: pa.scalar(n, pa.uint32()) for n in (13, 16, 0x85EBCA6B, 0xC2B2AE35)}


def key_groups(kbs: list[bytes], maxp: int) -> pa.Array:
    """``key_group_of_bytes`` of every encoded key, in Arrow (format.md 3.2: fmix32(crc32) mod M)."""
    u = _U32
    h = pa.array(list(map(zlib.crc32, kbs)), pa.uint32())
    h = pc.bit_wise_xor(h, pc.shift_right(h, u[16]))
    h = pc.multiply(h, u[0x85EBCA6B])
    h = pc.bit_wise_xor(h, pc.shift_right(h, u[13]))
    h = pc.multiply(h, u[0xC2B2AE35])
    h = pc.bit_wise_xor(h, pc.shift_right(h, u[16]))
    m = pa.scalar(maxp, pa.uint32())
    return pc.subtract(h, pc.multiply(pc.divide(h, m), m)).cast(pa.int32())


def _value_cells(layout: ValueLayout, values: list[Any], exps: list[Any] | None, n: int,
                 cols: dict[str, Any]) -> None:
    kind = layout.info.kind
    v, uk = layout.value, layout.user_key
    if kind is StateKind.LIST:
        cols["value"] = values if v.typed else [[v.item(x) for x in e] for e in values]
    elif kind is StateKind.MAP:
        assert uk is not None
        if v.typed and uk.typed:
            cols["value"] = values
        else:
            cols["value"] = [{uk.item(k): v.item(x) for k, x in e.items()} for e in values]
        if exps is not None and not uk.typed:
            exps = [{uk.item(k): x for k, x in e.items()} for e in exps]
    else:
        cols["value"] = values if v.typed else [render(x) for x in values]
    if layout.pickled:
        cols["value_pickle"] = [pickle_dump(x) for x in values]
    cols["expires_ms"] = exps if exps is not None else [None] * n
