"""The change feed: every change record of one state between two checkpoints.

``format("statelog").option("changesFrom", A).option("changesTo", B)`` (plus ``root``,
``operator``, ``state``) returns one row per change record that checkpoint B includes and
checkpoint A does not, read from the changelog ranges B references (docs/spark.md,
"Change feed", states exactly what is representable):

* A stream's records ``[0, p)`` are known to a checkpoint when one of its changelog ranges
  of that stream ends at ``p`` or when its materialized base covers ``p`` (the manifest's
  ``covered``). The feed holds, per range of B, the records at or after A's position of
  that stream; ranges of streams A never saw must start at 0.
* If B builds on a materialization of a checkpoint after A, the records between A and that
  checkpoint were materialized into Parquet tables and are no longer individual changes: the
  feed refuses (``ConfigError``) rather than return an incomplete delta.
* B must descend from A: a stream A holds records of must be known to B at least as far.
  A B restored from a checkpoint older than A fails this check.

Each row carries the checkpoint it first appears in: the earliest retained checkpoint in
``(A, B]`` whose metadata includes it. ``replay_order`` orders the rows of one key group
as a restore replays them (``seq`` orders only within one ``stream``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statelog.changelog.ops import op_label
from statelog.changelog.reader import SegmentReader
from statelog.changelog.segment_ref import SegmentRef
from statelog.checkpoint.metadata import CheckpointMetadata, OperatorState
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import CheckpointNotFoundError, ConfigError
from statelog.job import StateJob
from statelog.keys.encoding import decode_key
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest, load_manifest
from statelog.readers import options as opt
from statelog.readers.restore import stream_state
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
    LONG,
    STRING,
    Columns,
    ValueLayout,
    parse_key_type,
    pickle_dump,
    render,
)
from statelog.store.options import StoreOptions


@dataclass(frozen=True)
class RangeRead:
    """Records ``[start, end)`` of one stream in key groups ``[kg_start, kg_end]``."""

    stream: str
    start: int
    end: int
    kg_start: int
    kg_end: int
    segments: tuple[SegmentRef, ...]
    # (position, checkpoint id), ascending: a record with seq < position first appears in that checkpoint
    boundaries: tuple[tuple[int, int], ...]

    def checkpoint_of(self, seq: int, default: int, positions: list[int]) -> int:
        """The checkpoint record ``seq`` first appears in (``positions``: the boundaries' positions)."""
        i = bisect.bisect_right(positions, seq)
        return self.boundaries[i][1] if i < len(self.boundaries) else default


@dataclass(frozen=True)
class FeedPlan:
    from_id: int
    to_id: int
    operator: str
    info: dict[str, Any]
    key_type: str | None
    partitions: int
    max_parallelism: int
    reads: tuple[RangeRead, ...]  # in replay order (handles by key group, ranges as listed)
    root: str
    store: StoreOptions  # resolved on the driver (see statelog.readers.options.job_store)

    @property
    def state_info(self) -> StateInfo:
        return StateInfo.from_json(self.info)

    def schema(self) -> pa.Schema:
        """The change rows' columns (Spark's types in their Arrow form)."""
        fields = [
            pa.field("checkpoint_id", LONG, False),
            pa.field("stream", STRING, False),
            pa.field("seq", LONG, False),
            pa.field("replay_order", LONG, False),
            pa.field("op", STRING, False),
            pa.field("key_group", INT, False),
            *key_fields(parse_key_type(self.key_type)),
            *namespace_fields(),
            *ValueLayout.of(self.state_info).change_fields(),
        ]
        return pa.schema(fields)


# -- planning ------------------------------------------------------------------------------------


def _known(store: Any, op: OperatorState | None, name: str, cache: dict[str, Manifest]) -> dict[str, int]:
    """Stream -> records ``[0, p)`` of state ``name`` a checkpoint's operator state includes."""
    known: dict[str, int] = {}
    if op is None:
        return known
    for h in op.subtasks:
        for r in h.changelog:
            if stream_state(r.stream) == name:
                known[r.stream] = max(known.get(r.stream, 0), r.end)
        for p in h.materialization:
            mop = load_manifest(store, p, cache).operators.get(op.uid)
            if mop is None:
                continue
            for s, end in mop.covered.items():
                if stream_state(s) == name:
                    known[s] = max(known.get(s, 0), end)
    return known


def _bases(op: OperatorState | None) -> set[str]:
    return {p.manifest for h in op.subtasks for p in h.materialization} if op is not None else set()


def plan_feed(options: Mapping[str, str]) -> FeedPlan:
    uid = opt.require(options, "operator", "the uid of the operator whose changes to read")
    name = opt.require(options, "state", "the state name (or __timers_event / __timers_processing)")
    key_type_name = opt.get(options, "keyType")
    parse_key_type(key_type_name)
    if opt.get(options, "changesFrom") is None:
        raise ConfigError('option "changesFrom" is required with "changesTo": the checkpoint the changes start after')
    if opt.get(options, "checkpoint") is not None:
        raise ConfigError('option "checkpoint" cannot be combined with "changesFrom"/"changesTo"')
    root, store = opt.job_store(options)
    job = opt.open_at(root, store)
    try:
        a = opt.resolve(job, opt.get(options, "changesFrom"), "changesFrom")
        b = opt.resolve(job, opt.get(options, "changesTo"), "changesTo")
        return _plan(job, a, b, uid, name, key_type_name, options, root, store)
    finally:
        job.close()


def _plan(job: StateJob, a: CheckpointMetadata, b: CheckpointMetadata, uid: str, name: str,
          key_type_name: str | None, options: Mapping[str, str], root: str, settings: StoreOptions) -> FeedPlan:
    if b.kind != "checkpoint":
        raise ConfigError("changesTo must be a checkpoint: a savepoint holds no changelog")
    if a.checkpoint_id > b.checkpoint_id:
        raise ConfigError(
            f"changesFrom ({a.checkpoint_id}) is after changesTo ({b.checkpoint_id}); give the older "
            "checkpoint as changesFrom"
        )
    where_b = f"checkpoint {b.checkpoint_id}"
    op_b = opt.operator_of(b, uid, where_b)
    info = opt.state_of(op_b, name, where_b)
    op_a = a.operators.get(uid)
    a_name = opt.describe(a)
    cache: dict[str, Manifest] = {}
    store = job.store
    known_a = _known(store, op_a, name, cache)
    # 1. B's base must not hold changes made after A
    same_base = _bases(op_b) == _bases(op_a)
    for key in sorted(_bases(op_b) - _bases(op_a)):
        m = load_manifest(store, key, cache)
        if m.checkpoint_id > a.checkpoint_id:
            raise ConfigError(
                f"the changes of state {name!r} between {a_name} and checkpoint {b.checkpoint_id} are not "
                f"representable: checkpoint {b.checkpoint_id} builds on materialization {m.mid} of checkpoint "
                f"{m.checkpoint_id}, which materialized the changes up to {m.checkpoint_id} into state tables. "
                f"Read changes from {m.checkpoint_id} on (changesFrom={m.checkpoint_id}), or compare the "
                "states of both checkpoints"
            )
        mop = m.operators.get(uid)
        for s, end in (mop.covered.items() if mop is not None else ()):
            if stream_state(s) == name and end > known_a.get(s, 0):
                raise ConfigError(
                    f"checkpoint {b.checkpoint_id} does not descend from {a_name}: its base materialization "
                    f"{m.mid} holds records of stream {s} that {a_name} does not"
                )
    if a.kind == "savepoint" and not same_base:
        raise ConfigError(
            f"checkpoint {b.checkpoint_id} was not restored from {a_name} (it builds on other state tables); "
            "the feed needs changesTo to descend from changesFrom"
        )
    known_b = _known(store, op_b, name, cache)
    # 2. B must know every record A knows (else B was restored from something older than A)
    for s, end in known_a.items():
        if known_b.get(s, 0) < end:
            raise ConfigError(
                f"checkpoint {b.checkpoint_id} does not descend from {a_name}: {a_name} includes records "
                f"[0, {end}) of stream {s}, checkpoint {b.checkpoint_id} only [0, {known_b.get(s, 0)}) "
                "(was the job restored from an older checkpoint?)"
            )
    # 3. where each record first appears: retained checkpoints in (A, B]
    between: list[tuple[int, dict[str, int]]] = []
    for cid in job.catalog.checkpoint_ids():
        if a.checkpoint_id < cid < b.checkpoint_id:
            try:
                c = job.catalog.load(cid)
            except CheckpointNotFoundError:
                continue
            between.append((cid, _known(store, c.operators.get(uid), name, cache)))
    between.append((b.checkpoint_id, known_b))
    reads = []
    for h in sorted(op_b.subtasks, key=lambda h: h.key_groups.start):
        for r in h.changelog:
            if stream_state(r.stream) != name:
                continue
            if r.stream not in known_a and r.start > 0:
                raise ConfigError(
                    f"checkpoint {b.checkpoint_id} does not descend from {a_name}: stream {r.stream} starts at "
                    f"record {r.start}, whose predecessors {a_name} does not include"
                )
            start = max(r.start, known_a.get(r.stream, 0))
            if start >= r.end:
                continue
            bounds: list[tuple[int, int]] = []
            top = start
            for cid, known in between:
                p = min(known.get(r.stream, 0), r.end)
                if p > top:
                    bounds.append((p, cid))
                    top = p
            segs = tuple(s for s in r.segments if s.end > start)
            reads.append(RangeRead(r.stream, start, r.end, r.key_groups.start, r.key_groups.end, segs, tuple(bounds)))
    partitions = opt.parse_partitions(options, max(2, op_b.parallelism), b.max_parallelism)
    return FeedPlan(a.checkpoint_id, b.checkpoint_id, uid, info.to_json(), key_type_name, partitions,
                    b.max_parallelism, tuple(reads), root, settings)


# -- reading -------------------------------------------------------------------------------------


def feed_batches(job: StateJob, plan: FeedPlan, kgr: KeyGroupRange, columns: Columns,
                 batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    info = plan.state_info
    layout = ValueLayout.of(info)
    key_type = parse_key_type(plan.key_type)
    sources = key_sources(key_type)
    v, uk = layout.value, layout.user_key
    if not layout.timers:
        sources["value"] = pa.list_(v.arrow) if info.kind is StateKind.LIST else v.arrow
        if uk is not None:
            sources["user_key"] = uk.arrow
    reader = SegmentReader(job.store)
    names = columns.names
    keys: dict[bytes, tuple[Any, Any]] = {}
    nss: dict[bytes, Any] = {}
    cols: dict[str, list[Any]] = {n: [] for n in names}
    n = 0
    order = 0
    for rr in plan.reads:
        sub = KeyGroupRange(rr.kg_start, rr.kg_end).intersect(kgr)
        if sub.is_empty:
            continue
        positions = [p for p, _ in rr.boundaries]
        for batch in reader.read_range(rr.stream, rr.start, rr.end, sub, rr.segments):
            for seq, kg, op, kb, nsb, ukey, value, exp in batch.rows():
                k = keys.get(kb)
                if k is None:
                    obj = decode_key(kb)
                    if key_type is not None:
                        k = keys[kb] = (typed_keys([obj], key_type)[0], None)
                    else:
                        k = keys[kb] = (obj, obj if type(obj) is str else render(obj))
                ns = nss.get(nsb)
                if ns is None:
                    ns = nss[nsb] = (render(decode_key(nsb)),)
                cols["checkpoint_id"].append(rr.checkpoint_of(seq, plan.to_id, positions))
                cols["stream"].append(rr.stream)
                cols["seq"].append(seq)
                cols["replay_order"].append(order)
                cols["op"].append(op_label(op))
                cols["key_group"].append(kg)
                cols["key"].append(k[0] if key_type is not None else k[1])
                if key_type is None:
                    cols["key_bytes"].append(kb)
                cols["namespace"].append(ns[0])
                cols["namespace_bytes"].append(nsb)
                if layout.timers:
                    cols["timestamp"].append(value)
                else:
                    if uk is not None:
                        cols["user_key"].append(uk.item(ukey))
                        if uk.pickled:
                            cols["user_key_pickle"].append(pickle_dump(ukey))
                    if info.kind is StateKind.LIST:
                        cols["value"].append(None if value is None else
                                             (value if v.typed else [v.item(x) for x in value]))
                    else:
                        cols["value"].append(v.item(value))
                    if v.pickled:
                        cols["value_pickle"].append(pickle_dump(value))
                    cols["expires_ms"].append(exp)
                order += 1
                n += 1
                if n >= batch_rows:
                    yield to_batch(columns, cols, sources, key_type)
                    cols = {c: [] for c in names}
                    n = 0
    if n:
        yield to_batch(columns, cols, sources, key_type)
