"""One operator's replica: a keyed backend without changelog, and what it has applied.

An :class:`OperatorReplica` holds the whole key-group range of one operator in one
:class:`~statelog.state.backend.KeyedStateBackend` without changelog, restored from a
checkpoint as a backend restores (on demand or at once, in memory or on disk:
:func:`statelog.restore.start.start_restore`), and the changelog position it has applied per
stream (the end of the stream's range in that checkpoint, or beyond it with flushed changes).
:meth:`OperatorReplica.gap` says whether a newer checkpoint extends what it applied; if so,
:meth:`OperatorReplica.apply` reads and applies only the changelog after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.ops import Op
from statelog.changelog.reader import ChangeBatch, SegmentReader
from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata
from statelog.compute import pc
from statelog.descriptors import AggregatingStateDescriptor, StateDescriptor, StateInfo, StateKind
from statelog.errors import StatelogError, StateNotFoundError
from statelog.keys.columns import decode_key_array
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest, load_manifest
from statelog.readers.restore import descriptor_of
from statelog.restore.collector import gc_paused
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.restore.start import start_restore
from statelog.state.backend import KeyedStateBackend
from statelog.state.tables import disk as disk_tables
from statelog.store.base import ObjectStore
from statelog.types import fast_check

__all__ = ["OperatorReplica", "Prepared", "ReplicaOptions"]

log = logging.getLogger(__name__)

Record = tuple[bytes, bytes, int, Any, Any, "int | None"]
_PUT = Op.PUT.value


@dataclass
class ReplicaOptions:
    """How replicas hold state: ``state_store`` ``"memory"`` or ``"disk"`` (with
    ``state_memory`` bytes of cache under ``state_dir``), restored ``on_demand`` or at once;
    ``clock``: the clock of TTL expiry (milliseconds; the wall clock when ``None``)."""

    state_store: str = "memory"
    state_memory: int = 512 << 20
    state_dir: str | None = None
    on_demand: bool = True
    clock: Callable[[], int] | None = None
    descriptors: dict[str, dict[str, StateDescriptor]] = field(default_factory=dict)


@dataclass
class Puts:
    """A block's change records when all are puts to one namespace (a value-like state's
    usual changes): its decoded keys and values, applied in one bulk update."""

    nsb: bytes
    keys: list[Any]
    values: list[Any]
    expires: list[int | None]
    key_bytes: pa.ChunkedArray

    def records(self) -> tuple[list[Record], dict[bytes, Any]]:
        """The same changes as records, and their keys by key bytes (a state that is not
        value-like: its applier applies them, or refuses the op as corrupt)."""
        kbs, n = self.key_bytes.to_pylist(), len(self.keys)
        recs = list(zip(kbs, [self.nsb] * n, [_PUT] * n, [None] * n, self.values, self.expires, strict=True))
        return recs, dict(zip(kbs, self.keys, strict=True))


Chunk = list[Record] | Puts


def _puts(batch: ChangeBatch) -> Puts | None:
    """The records of ``batch`` as :class:`Puts` when they are all puts to one namespace
    (checked on the Arrow columns), else ``None``."""
    t = batch.table
    if batch.state in TIMER_STATES or not t.num_rows:
        return None
    ops, ns = t.column("op"), t.column("namespace")
    if pc.min_max(ops).as_py() != {"min": _PUT, "max": _PUT} or pc.count_distinct(ns).as_py() != 1:
        return None
    keys = t.column("key")
    return Puts(ns[0].as_py(), decode_key_array(keys), batch.values(), t.column("expires_ms").to_pylist(), keys)


class Prepared:
    """Change records read for one replica, per state in order, not applied yet."""

    def __init__(self, ranges: list[ChangelogRange]) -> None:
        self.ranges = ranges
        self.records: dict[str, list[Chunk]] = {}  # per state, in order
        self.keys: dict[bytes, Any] = {}  # key bytes -> decoded key, of the records' keys
        self.count = 0
        self.meta: CheckpointMetadata | None = None  # the checkpoint they catch up to


class OperatorReplica:
    """The state of operator ``uid`` at checkpoint ``meta`` (then moved on by :meth:`apply`)."""

    def __init__(
        self, store: ObjectStore, meta: CheckpointMetadata, uid: str, options: ReplicaOptions,
        manifests: dict[str, Manifest],
    ) -> None:
        self.uid = uid
        self._options = options
        self._store, self._manifests = store, manifests
        kgr = KeyGroupRange(0, meta.max_parallelism - 1)
        self.key_groups = kgr
        disk = options.state_store == "disk"
        restored, loader = start_restore(
            store, meta, uid, kgr, manifests, on_demand=options.on_demand, disk=disk, background=True,
            options=OnDemandOptions(),
        )  # fmt: skip
        ws = None
        if disk:
            ws = disk_tables.DiskWorkingSet(options.state_memory, options.state_dir, meta.max_parallelism, f"follow-{uid}-")
        self.backend = KeyedStateBackend(
            operator_uid=uid, subtask=0, parallelism=1, max_parallelism=meta.max_parallelism, writer=None,
            clock=options.clock, restored=restored, loader=loader, working_set=ws,
        )  # fmt: skip
        self.infos: dict[str, StateInfo] = {}
        self.states: dict[str, Any] = {}  # the registered states, by name
        self._register(meta)
        # per stream, the position up to which its records are applied
        self.applied: dict[str, int] = {}
        for r in _ranges(meta, uid):
            self.applied[r.stream] = max(self.applied.get(r.stream, 0), r.end)
        self.base = _base(meta, uid)  # the materializations the applied state builds on

    def _register(self, meta: CheckpointMetadata) -> None:
        op = meta.operators.get(self.uid)
        given = self._options.descriptors.get(self.uid, {})
        for name, info in (op.states if op is not None else {}).items():
            if name in TIMER_STATES or name in self.infos:
                continue
            self.infos[name] = info
            self.states[name] = self.backend.get_state(given.get(name) or descriptor_of(info))

    def gap(self, meta: CheckpointMetadata, same_writer: bool) -> str | None:
        """Why checkpoint ``meta`` does not extend what this replica applied (``None``: it
        does, and :meth:`apply` catches up by reading the changelog after it).
        ``same_writer``: ``meta`` was published by the writer that published the checkpoint
        applied last (the same lease generation): only then may a stream applied beyond
        ``meta`` (flushed changes) or no longer listed (materialized) be the same history, or
        the base be another materialization (a writer adopts only materializations of its own
        history). A checkpoint of another writer extends this replica only when it builds on
        the same materializations and lists every stream applied here, up to where it was
        applied or further: then it descends from the checkpoint applied here or a later one."""
        if not same_writer and _base(meta, self.uid) != self.base:
            return f"checkpoint {meta.checkpoint_id} of another writer builds on other materializations"
        ends: dict[str, tuple[int, int]] = {}
        for r in _ranges(meta, self.uid):
            lo, hi = ends.get(r.stream, (r.start, r.end))
            ends[r.stream] = (min(lo, r.start), max(hi, r.end))
        for stream, (start, end) in ends.items():
            done = self.applied.get(stream)
            if done is None:
                if start != 0:
                    return f"stream {stream} starts at record {start} in checkpoint {meta.checkpoint_id}, " \
                        "after records this replica never applied (materialized)"
            elif done > end and not same_writer:
                return f"stream {stream} ends at record {end} in checkpoint {meta.checkpoint_id}, before " \
                    f"record {done} applied here: the job restored an earlier checkpoint"
            elif start > done:
                return f"stream {stream} starts at record {start} in checkpoint {meta.checkpoint_id}, " \
                    f"after record {done} applied here: the records between are materialized"
        gone = sorted(set(self.applied) - set(ends))
        if gone and not same_writer:
            return f"stream {gone[0]} applied here is not in checkpoint {meta.checkpoint_id} of another writer"
        if gone:  # materialized: only up to where it was applied here, or records are missing
            covered = self._covered(meta)
            for stream in gone:
                if covered.get(stream) != self.applied[stream]:
                    return f"stream {stream} is materialized up to record {covered.get(stream)} in checkpoint " \
                        f"{meta.checkpoint_id}, applied here up to record {self.applied[stream]}"
        return None

    def _covered(self, meta: CheckpointMetadata) -> dict[str, int]:
        """Per stream, the records the materializations ``meta`` builds on hold."""
        out: dict[str, int] = {}
        op = meta.operators.get(self.uid)
        for part in {p for h in op.subtasks for p in h.materialization} if op is not None else ():
            mop = load_manifest(self._store, part, self._manifests, job_id=meta.job_id).operators.get(self.uid)
            for stream, end in (mop.covered.items() if mop is not None else ()):
                out[stream] = max(out.get(stream, 0), end)
        return out

    def prepare(self, reader: SegmentReader, meta: CheckpointMetadata) -> Prepared:
        """Read the changelog of checkpoint ``meta`` after what was applied (:meth:`gap` said
        it extends it), for :meth:`install`."""
        todo = []
        for r in _ranges(meta, self.uid):
            done = self.applied.get(r.stream, 0)
            if r.end > done:
                todo.append(ChangelogRange(r.stream, max(done, r.start), r.end, r.key_groups, r.segments))
        prepared = self.read(reader, todo)
        prepared.meta = meta
        return prepared

    def read(self, reader: SegmentReader, ranges: list[ChangelogRange]) -> Prepared:
        """Read the records of ``ranges`` (in order per state) for :meth:`install`: only the
        segments that hold records of a range (a checkpoint's range lists every segment since
        its materialization; the follower applied most of them), a batch's columns at once
        and its keys decoded in bulk (:func:`~statelog.keys.columns.decode_key_array`)."""
        out = Prepared(ranges)
        for r in ranges:
            segments = [s for s in r.segments if s.end > r.start and s.start < r.end]
            for batch in reader.read_range(r.stream, r.start, r.end, r.key_groups, segments):
                chunks = out.records.setdefault(batch.state, [])
                out.count += batch.table.num_rows
                puts = _puts(batch)
                if puts is not None:
                    chunks.append(puts)
                    continue
                _seqs, _kgs, ops, kbs, nsbs, ukeys, values, exps = batch.columns()
                chunks.append(list(zip(kbs, nsbs, ops, ukeys, values, exps, strict=True)))
                if batch.state not in TIMER_STATES:
                    out.keys.update(zip(kbs, decode_key_array(batch.table.column("key")), strict=True))
        return out

    def install(self, prepared: Prepared) -> None:
        """Apply what :meth:`prepare` or :meth:`read` read, and move the applied positions on."""
        backend = self.backend
        backend.wait_loaded()  # (an on-demand restore: every key group before changes)
        if prepared.meta is not None:
            self._register(prepared.meta)
        with gc_paused():  # (no reference cycles among the entries; see statelog.restore.collector)
            self._apply(prepared.records, prepared.keys)
        for r in prepared.ranges:
            self.applied[r.stream] = max(self.applied.get(r.stream, 0), r.end)
        if prepared.meta is not None:
            self.base = _base(prepared.meta, self.uid)
            kept = {r.stream for r in _ranges(prepared.meta, self.uid)}
            for stream in [s for s in self.applied if s not in kept]:
                del self.applied[stream]

    def _apply(self, records: dict[str, list[Chunk]], keys: dict[bytes, Any]) -> None:
        backend = self.backend
        for name, chunks in records.items():
            if name in TIMER_STATES:
                d = TIMER_STATES.index(name)
                for chunk in chunks:
                    assert isinstance(chunk, list)
                    for kb, nsb, op, _ukey, value, _exp in chunk:
                        backend.timers.apply(d, kb, nsb, op, value)
                continue
            state = backend._states.get(name)
            if state is None:
                raise StatelogError(f"operator {self.uid!r}: changelog of state {name!r}, which no checkpoint describes")
            info = self.infos.get(name)
            value_like = info is not None and info.kind not in (StateKind.LIST, StateKind.MAP)
            for chunk in chunks:
                if not isinstance(chunk, Puts):
                    state.apply_many(chunk, keys)
                elif value_like:
                    state.replay_puts(chunk.nsb, chunk.keys, chunk.values, chunk.expires)
                else:
                    state.apply_many(*chunk.records())
            state.prune()

    def ahead_of(self, meta: CheckpointMetadata) -> int:
        """The records applied beyond checkpoint ``meta`` (flushed changes after it)."""
        ends = _stream_ends(meta, self.uid)
        return sum(max(0, done - ends.get(s, done)) for s, done in self.applied.items())

    def check_state(self, name: str) -> StateInfo:
        """The info of state ``name``; ``StateNotFoundError`` naming the states when there is none."""
        info = self.infos.get(name)
        if info is None:
            known = ", ".join(sorted(self.infos)) or "none"
            raise StateNotFoundError(f"operator {self.uid!r} has no state {name!r} (its states: {known})")
        return info

    def get(self, name: str, key: Any, namespace: Any) -> Any:
        """The value of state ``name`` at ``key`` and ``namespace`` (as the state kind's read
        returns it: value, list, dict of a map; an aggregating state's result, or its
        accumulator when its aggregate function is not known)."""
        info = self.check_state(name)
        state = self.states[name]
        self.backend.set_current_key(key)
        state.set_namespace(namespace)
        kind = info.kind
        if kind is StateKind.LIST:
            return state.get()
        if kind is StateKind.MAP:
            return dict(state.items())
        if kind is StateKind.REDUCING:
            return state.get()
        if kind is StateKind.AGGREGATING:
            known_fn = isinstance(self._options.descriptors.get(self.uid, {}).get(name), AggregatingStateDescriptor)
            return state.get() if known_fn else state.accumulator()
        return state.value()

    def get_many(self, name: str, keys: list[Any], namespace: Any) -> pa.Array | list[Any]:
        """The values of state ``name`` at ``keys`` (and ``namespace``): an Arrow array where
        :meth:`get_column` reads them a column at a time, else a list read key by key."""
        column = self.get_column(name, keys, namespace) if len(keys) > 1 else None
        return column if column is not None else [self.get(name, key, namespace) for key in keys]

    def get_column(self, name: str, keys: list[Any], namespace: Any) -> pa.Array | None:
        """The values of value state ``name`` at ``keys`` (and ``namespace``) as one Arrow array
        of its value type, the default where absent, computed a column at a time
        (``ValueState.get_many``: keys encoded and their key groups found in bulk, one
        ``dict.get`` per key); ``None`` for any other state (another kind, TTL, a value type
        whose Python values Arrow does not give back as they are, such as maps or pickled
        values), which :meth:`get` reads key by key."""
        info = self.check_state(name)
        state = self.states[name]
        # fast_check: the value type's values are one plain Python type, which Arrow gives back as is
        if info.kind is not StateKind.VALUE or info.ttl is not None or fast_check(state.descriptor.value_type) is None:
            return None
        state.set_namespace(namespace)
        return state.get_many(keys)

    def close(self) -> None:
        self.backend.close()


def _ranges(meta: CheckpointMetadata, uid: str) -> list[ChangelogRange]:
    op = meta.operators.get(uid)
    return [r for h in op.subtasks for r in h.changelog] if op is not None else []


def _base(meta: CheckpointMetadata, uid: str) -> frozenset[tuple[str, int, int]]:
    op = meta.operators.get(uid)
    if op is None:
        return frozenset()
    return frozenset((p.manifest, p.key_groups.start, p.key_groups.end) for h in op.subtasks for p in h.materialization)


def _stream_ends(meta: CheckpointMetadata, uid: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in _ranges(meta, uid):
        out[r.stream] = max(out.get(r.stream, 0), r.end)
    return out
