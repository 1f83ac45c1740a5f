"""The keyed state backend of one operator subtask.

It holds the subtask's keyed state in memory, scoped to a current key (and per state a
namespace), captures every mutation into a changelog stream per state and takes
checkpoints in two parts: :meth:`KeyedStateBackend.snapshot` seals every stream's position
synchronously and returns a :class:`PendingSnapshot`, whose :meth:`~PendingSnapshot.result`
waits until everything up to those positions is durable and returns the subtask's state
handle.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statelog.changelog.stream import ChangelogStream
from statelog.changelog.writer import ChangelogWriter
from statelog.checkpoint.metadata import ChangelogRange, MaterializedPart, SubtaskStateHandle
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateInfo,
    StateKind,
    ValueStateDescriptor,
)
from statelog.errors import (
    CheckpointAbortedError,
    ConfigError,
    KeyGroupError,
    SerializationError,
    StatelogError,
)
from statelog.keys.columns import decode_key_array, first_legacy_key
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes, key_group_range_for_subtask
from statelog.materialization.manifest import Manifest
from statelog.restore.changes import RestoredChanges, base_entries
from statelog.restore.collector import gc_paused
from statelog.restore.eager import restore_timers
from statelog.restore.ondemand.loader import KeyGroupLoader
from statelog.restore.ondemand.prepare import PreparedKeyGroup
from statelog.state.context import NO_KEY, KeyContext
from statelog.state.kinds import (
    STATE_CLASSES,
    AggregatingState,
    KeyedState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from statelog.state.tables import MemoryWorkingSet, WorkingSet
from statelog.state.timers import TIMER_INFOS, TimerService

if TYPE_CHECKING:
    from statelog.state.tables.disk import DiskWorkingSet

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class KeyedStateBackend:
    """Keyed state of one subtask of one operator, with optional changelog."""

    def __init__(
        self,
        *,
        operator_uid: str,
        subtask: int = 0,
        parallelism: int = 1,
        max_parallelism: int = 128,
        writer: ChangelogWriter | None = None,
        stream_prefix: str | None = None,
        clock: Callable[[], int] | None = None,
        restored: RestoredChanges | None = None,
        loader: KeyGroupLoader | None = None,
        working_set: WorkingSet | None = None,
    ) -> None:
        self.operator_uid = operator_uid
        self.subtask = subtask
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.key_groups = key_group_range_for_subtask(max_parallelism, parallelism, subtask)
        self._kg_lo, self._kg_hi = self.key_groups.start, self.key_groups.end
        self._writer = writer
        self._stream_prefix = stream_prefix or f"{operator_uid}.{subtask}.{uuid.uuid4().hex[:12]}"
        self._streams: dict[str, ChangelogStream] = {}
        # the current key as the states and timers see it (set_current_key writes it)
        self.key_context = KeyContext(operator_uid, clock or wall_clock_ms, writer is not None)
        # the store of the states' entries (statelog/state/tables): Python dicts unless given
        # (the disk-backed working set of state_store="disk"); its key cache is this backend's
        store = working_set if working_set is not None else MemoryWorkingSet()
        store.attach(self.key_context)
        self._working_set: WorkingSet = store
        self._kcache = store.key_cache
        # the disk store itself (None in memory): a restore bulk-loads into its database
        self._ws: DiskWorkingSet | None = store if store.on_disk else None  # type: ignore[assignment]
        self._states: dict[str, KeyedState] = {}
        self._restored = restored or RestoredChanges()
        self._inherited: tuple[ChangelogRange, ...] = tuple(self._restored.inherited)
        # the materialized base: parts of manifests, the checkpoint it was taken at, and the
        # changelog positions it covers (known when this backend adopted it)
        self._base_parts: tuple[MaterializedPart, ...] = tuple(self._restored.parts)
        self._base_cid = self._restored.base_checkpoint_id
        self._covered: dict[str, int] = {}
        # completed checkpoints this backend's state descends from: a materialization of one
        # of them is a valid base for the next checkpoints
        self._lineage: set[int] = set()
        self._pending = 0  # snapshots sealed but not completed or cancelled
        self._pending_lock = threading.Lock()
        if self._restored.checkpoint_id is not None:
            self._lineage.add(self._restored.checkpoint_id)
        self._decoded_keys: dict[bytes, Any] = {}
        # set_current_key runs once per record: the store's key setter answers a key in its
        # key cache with one dict lookup and sends any other key to _set_key_slow; the timer
        # service sets the key of a firing timer through the same setter
        self.set_current_key = self.key_context.set_current_key = store.key_setter(  # type: ignore[method-assign]
            self.key_context, self._set_key_slow
        )
        self.timers = TimerService(
            self.key_context,
            (self._open_stream(TIMER_INFOS[0], True), self._open_stream(TIMER_INFOS[1], True)),
        )
        restore_timers(self._restored, self.timers, self._check_restored_keys)
        self._closed = False
        # on-demand restore (statelog/restore/ondemand/): key groups not loaded yet load on first touch
        self._loader = loader
        self._stash: dict[str, list[tuple[list[Any], list[Any]]]] = {}  # loaded, state not registered
        self.restore_stats: dict[str, Any] = {"on_demand": loader is not None}
        self.key_context.load_all = self.wait_loaded
        if loader is not None:
            self._opened = time.monotonic()
            loader.start(self._check_restored_keys)  # the cyclic GC paused until the loader is closed

    # -- current key ---------------------------------------------------------------------------

    def set_current_key(self, key: Any) -> None:
        """Scope all states to ``key``. The key must belong to this subtask's key groups.

        Each backend answers it with its store's key setter, bound in ``__init__``
        (:meth:`statelog.state.tables.WorkingSet.key_setter`); this method is what it does
        for a key not in the key cache."""
        self._set_key_slow(key)

    def _set_key_slow(self, key: Any) -> None:
        kb = encode_key(key)
        kg = key_group_of_bytes(kb, self.max_parallelism)
        if kg < self._kg_lo or kg > self._kg_hi:
            raise KeyGroupError(
                f"key {key!r} is in key group {kg}, which operator {self.operator_uid!r} subtask "
                f"{self.subtask} of {self.parallelism} does not own (it owns {self.key_groups}); route "
                "records by statelog.subtask_for_key_group(max_parallelism, parallelism, kg)"
            )
        if self._loader is not None:
            self._load_key_group(kg, kb)
        info = (type(key), kb, kg)
        prev = self._kcache.get(key)
        if prev is None:
            self._working_set.admit(key, info)  # (the disk store reads the key's entries)
        elif prev[1] != kb:
            # keys equal in Python (1, True, 1.0) have one encoding; only a registered custom
            # type that compares equal to another key can get here
            raise SerializationError(
                f"key {key!r} ({type(key).__name__}) equals a key of type {prev[0].__name__} used "
                "before but encodes differently: keys equal in Python must be one key; a type "
                "registered with register_key_type must not compare equal to another key type"
            )
        # else keys equal across types (1, True) keep the first type cached: the key setter's
        # type check sends the others here, and their bytes are the cached ones
        ctx = self.key_context
        ctx.key = key
        ctx.key_info = info

    @property
    def on_disk(self) -> bool:
        """Whether the keyed state is in the disk-backed working set (``state_store="disk"``)."""
        return self._working_set.on_disk

    def prefetch(self, keys: Iterable[Any]) -> int:
        """A hint: records of ``keys`` come next. With the disk-backed working set
        (``state_store="disk"``) the keys not resident are read from its database in one
        batched read (RocksDB's multi-get) and made resident, instead of one read per record
        as each is set current: a consumer loop that processes records in batches calls it
        with a batch's keys before the batch (measured at 2x10^6 keys and 51 MB, batches of
        2,048 records: uniform updates 10-25 % faster; docs/performance.md). The in-memory
        store has nothing to read: a no-op.

        Keys this subtask does not own, keys that cannot be encoded, and any key while an
        on-demand restore is still loading are skipped here (their records take the usual
        path, with its errors). Returns the number of keys read."""
        if self._loader is not None:
            return 0
        return self._working_set.prefetch(keys, self._kg_lo, self._kg_hi)

    @property
    def current_key(self) -> Any:
        """The current key (``None`` also when no key was set yet)."""
        key = self.key_context.key
        return None if key is NO_KEY else key

    @property
    def current_key_group(self) -> int:
        """The key group of the current key (-1 before the first ``set_current_key``)."""
        return self.key_context.key_info[2]

    @property
    def clock(self) -> Callable[[], int]:
        """The clock of TTL expiry, milliseconds (``time.time()`` unless given)."""
        return self.key_context.clock

    @property
    def changelog_enabled(self) -> bool:
        """Whether mutations are recorded in a changelog (else kept in memory only)."""
        return self.key_context.changelog_enabled

    # -- states --------------------------------------------------------------------------------

    def _open_stream(self, info: StateInfo, narrow: bool) -> ChangelogStream | None:
        """The changelog stream of one state (``None`` without changelog)."""
        if self._writer is None:
            return None
        stream = self._writer.open_stream(f"{self._stream_prefix}/{info.name}", info, narrow)
        self._streams[info.name] = stream
        return stream

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """Create (or return the existing) state for ``descriptor``; restored state is replayed."""
        existing = self._states.get(descriptor.name)
        if existing is not None:
            if existing.descriptor != descriptor:
                raise ConfigError(
                    f"state {descriptor.name!r} of operator {self.operator_uid!r} is already registered "
                    "with a different descriptor"
                )
            return existing
        cls = STATE_CLASSES.get(type(descriptor))
        if cls is None:
            raise ConfigError(f"unsupported state descriptor type {type(descriptor).__name__}")
        stored = self._restored.infos.get(descriptor.name)
        if stored is not None:
            why = descriptor.compatible_with(stored)
            if why is not None:
                raise ConfigError(
                    f"state {descriptor.name!r} of operator {self.operator_uid!r} cannot be restored: "
                    f"{why}; keep the stored type or use a new state name"
                )
        info = StateInfo.from_descriptor(descriptor)
        narrow = info.ttl is None and info.kind in (
            StateKind.VALUE, StateKind.REDUCING, StateKind.AGGREGATING
        )
        state = cls(self.key_context, descriptor, self._open_stream(info, narrow))
        self._states[descriptor.name] = state
        with gc_paused():
            self._replay(state)
        return state

    def get_value_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        return self.get_state(descriptor)

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        return self.get_state(descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        return self.get_state(descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        return self.get_state(descriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        return self.get_state(descriptor)

    def legacy_key_error(self, state: str, kb: bytes) -> SerializationError:
        """The error for a restored key (or namespace) in key encoding version 1 that version 2
        encodes differently (:meth:`KeyContext.legacy_key_error`)."""
        return self.key_context.legacy_key_error(state, kb)

    def _check_restored_keys(self, state: str, arr: Any) -> None:
        """Refuse version-1 keys a writing backend restores (a read-only one reads them)."""
        if self.changelog_enabled:
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            kb = first_legacy_key(arr)
            if kb is not None:
                raise self.legacy_key_error(state, kb)

    def _load_base(self, state: KeyedState) -> None:
        """Bulk-load the materialized rows of ``state`` (before its changelog tail is replayed)."""
        for table in self._restored.base.pop(state.name, ()):
            self._check_restored_keys(state.name, table.column("key"))
            if self._ws is not None:
                kbs, nss, values = base_entries(state.info, table, raw_keys=True)
                state.put_rows(kbs, table.column("key_group").to_pylist(), nss, values)
            else:
                self._put_entries(state, *base_entries(state.info, table))

    @staticmethod
    def _put_entries(state: KeyedState, keys: list[Any], nss: list[bytes], values: list[Any]) -> None:
        if nss and nss.count(nss[0]) == len(nss):  # one namespace: one bulk update
            state._table_for(nss[0]).update(zip(keys, values, strict=True))
        else:
            table_for = state._table_for
            for key, nsb, v in zip(keys, nss, values, strict=True):
                table_for(nsb)[key] = v

    def _apply_records(self, state: KeyedState, records: list[tuple[bytes, bytes, int, Any, Any, int | None]]) -> None:
        known = self._decoded_keys
        new = list({r[0] for r in records if r[0] not in known})
        if new:  # decode the keys in bulk (int and short-string columns decode without a loop)
            arr = pa.array(new, pa.binary())
            self._check_restored_keys(state.name, arr)
            known.update(zip(new, decode_key_array(arr), strict=True))
        state.apply_many(records, known)
        if self._ws is not None and len(known) > 1 << 16:
            known.clear()  # bounded with a disk-backed working set

    def _replay(self, state: KeyedState) -> None:
        self._load_base(state)
        for bases, records in self._stash.pop(state.name, ()):  # key groups loaded on demand before
            for entries in bases:
                self._put_entries(state, *entries)
            if records:
                self._apply_records(state, records)
        records = self._restored.records.pop(state.name, None)
        if records:
            self._apply_records(state, records)
        state.prune()

    # -- on-demand restore (statelog/restore/ondemand/) ----------------------------------------

    def _load_key_group(self, kg: int | None, kb: bytes | None = None) -> None:
        """Install what the loader prepared, and key group ``kg`` (preparing it if needed), or
        only the slice of it that holds key bytes ``kb``."""
        loader = self._loader
        assert loader is not None
        if loader.load(self._install, kg, kb):
            self.restore_stats.setdefault("first_key_group_s", round(time.monotonic() - self._opened, 6))
        if loader.done:
            self._loaded()

    def _install(self, p: PreparedKeyGroup) -> None:
        ws = self._ws
        with gc_paused():
            if ws is not None:  # key bytes of every state: straight into the database, at once
                bases = {name: parts for name, parts in p.base.items() if parts}
                if bases:
                    ws.put_key_group(p.key_group, bases)
                    for name, parts in bases.items():
                        state = self._states.get(name)
                        if state is not None:  # (one that registers later finds them in ws)
                            for nsb in {nsb for _kbs, nss, _v in parts for nsb in set(nss)}:
                                state._table_for(nsb)
            for name in p.base.keys() | p.records.keys():
                bases = p.base.get(name, []) if ws is None else []
                records = p.records.get(name, [])
                if not bases and not records:
                    continue
                state = self._states.get(name)
                if state is None:  # installed when the state registers
                    self._stash.setdefault(name, []).append((bases, records))
                    continue
                for entries in bases:
                    self._put_entries(state, *entries)
                if records:
                    self._apply_records(state, records)

    def _loaded(self) -> None:
        loader = self._loader
        assert loader is not None
        loader.close()
        self._loader = None
        for state in self._states.values():
            state.prune()
        self.restore_stats.update(
            fully_loaded_s=round(time.monotonic() - self._opened, 6), rows=loader.rows,
            records=loader.records, bytes_read=loader.bytes_read,
        )  # fmt: skip
        log.info(
            "operator %r subtask %d: every key group loaded on demand in %.3fs (%d rows, %d records, %d bytes)",
            self.operator_uid, self.subtask, self.restore_stats["fully_loaded_s"], loader.rows, loader.records,
            loader.bytes_read,
        )  # fmt: skip

    @property
    def loading(self) -> bool:
        """Key groups of an on-demand restore are still to be loaded."""
        return self._loader is not None

    def poll_loading(self) -> None:
        """Install the key groups the background loader prepared (the runtime calls it when idle)."""
        if self._loader is not None:
            self._load_key_group(None)

    def wait_loaded(self) -> None:
        """Load every key group not loaded yet (on-demand restore); at once otherwise."""
        loader = self._loader
        if loader is None:
            return
        for p in loader.take_all():
            self._install(p)
        self._loaded()

    def state_infos(self) -> list[StateInfo]:
        """Descriptions of all states: registered ones, restored-but-unregistered ones, timers."""
        out = {n: s.info for n, s in self._states.items()}
        for n, info in self._restored.infos.items():
            out.setdefault(n, info)
        for info in TIMER_INFOS:
            out.setdefault(info.name, info)
        return list(out.values())

    def state_names(self) -> list[str]:
        return list(self._states)

    def entries(self, name: str) -> Iterator[tuple[Any, Any, Any]]:
        """``(key, namespace, value)`` of every live entry of a registered state."""
        self.wait_loaded()
        try:
            state = self._states[name]
        except KeyError:
            raise StatelogError(f"state {name!r} is not registered on operator {self.operator_uid!r}") from None
        return state.entries()

    # -- checkpoints ---------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> PendingSnapshot:
        """Synchronous part of a checkpoint: seal every state's changelog position (returns at once)."""
        if self._writer is None:
            raise StatelogError(
                f"operator {self.operator_uid!r} runs without changelog (changelog=False): it has no "
                "changelog position to seal; open it with changelog=True to checkpoint it"
            )
        if self._loader is not None:
            self._load_key_group(None)  # progress, and a loading error fails the checkpoint here
        sealed = [(s, s.position) for s in self._streams.values()]
        futures = [self._writer.persist(s, pos) for s, pos in sealed]
        # everything the handle needs from the task's side is captured here, on the task thread
        base = (self._base_parts, tuple(self._inherited), dict(self._covered), tuple(self.state_infos()))
        with self._pending_lock:
            self._pending += 1
        return PendingSnapshot(self, checkpoint_id, sealed, futures, base)

    def _snapshot_done(self) -> None:
        """A pending snapshot completed or was cancelled: segments it needed may go now."""
        with self._pending_lock:
            self._pending -= 1
            if self._pending == 0:
                self._forget_covered_segments()

    def _forget_covered_segments(self) -> None:
        """Drop the stream's references to segments the adopted base covers (memory only).

        Called with ``_pending_lock`` held and no snapshot pending: a pending snapshot's
        handle may still need segments before the new base (it was sealed on the old one).
        """
        for stream in self._streams.values():
            done = self._covered.get(stream.stream_id)
            if done:
                with stream.lock:
                    stream.segments = [seg for seg in stream.segments if seg.end > done]

    def _handle(
        self,
        sealed: list[tuple[ChangelogStream, int]],
        base: tuple[tuple[MaterializedPart, ...], tuple[ChangelogRange, ...], dict[str, int], tuple[StateInfo, ...]],
    ) -> SubtaskStateHandle:
        parts, inherited, covered, infos = base
        ranges = list(inherited)
        for stream, pos in sealed:
            start = covered.get(stream.stream_id, 0)
            if pos > start:
                segs = tuple(stream.segments_for(start, pos))
                reached = start
                for seg in segs:
                    if seg.start > reached:
                        break
                    reached = max(reached, seg.end)
                if reached < pos:
                    raise StatelogError(
                        f"stream {stream.stream_id}: the segments of records [{start}, {pos}) are not all "
                        f"known (known up to {reached}); this checkpoint cannot be completed"
                    )
                ranges.append(ChangelogRange(stream.stream_id, start, pos, self.key_groups, segs))
        return SubtaskStateHandle(
            operator_uid=self.operator_uid,
            subtask=self.subtask,
            parallelism=self.parallelism,
            key_groups=self.key_groups,
            changelog=tuple(ranges),
            states=infos,
            materialization=parts,
        )

    # -- materialization -----------------------------------------------------------------------

    @property
    def base_checkpoint_id(self) -> int | None:
        """The checkpoint of the materialization this backend's checkpoints build on, if any."""
        return self._base_cid if self._base_parts else None

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """Note that a checkpoint including this backend's snapshot was published."""
        self._lineage.add(checkpoint_id)

    def adopt_materialization(self, manifest: Manifest) -> bool:
        """Build the next checkpoints on ``manifest`` plus only the changelog after it.

        Only a materialization of a completed checkpoint that this backend's state descends
        from qualifies (not, e.g., one taken by an earlier run after the checkpoint this
        backend was restored from), and only if it is newer than the current base.
        Call it from the task thread, between records (the runtime does so before a snapshot).
        """
        if manifest.checkpoint_id <= self._base_cid or manifest.checkpoint_id not in self._lineage:
            return False
        if self._loader is not None:  # key groups not loaded yet still need the restored handles
            return False
        mop = manifest.operators.get(self.operator_uid)
        if mop is None:
            return False
        covered = mop.covered
        inherited = []
        for r in self._inherited:
            done = covered.get(r.stream)
            if done is None:
                inherited.append(r)
            elif done < r.end:
                start = max(r.start, done)
                segs = tuple(s for s in r.segments if s.end > start)
                inherited.append(ChangelogRange(r.stream, start, r.end, r.key_groups, segs))
        self._base_parts = (manifest.reference(self.key_groups),)
        self._base_cid = manifest.checkpoint_id
        self._inherited = tuple(inherited)
        self._covered = {s.stream_id: covered[s.stream_id] for s in self._streams.values() if s.stream_id in covered}
        with self._pending_lock:
            if self._pending == 0:  # else when the last pending snapshot is done
                self._forget_covered_segments()
        self._lineage = {c for c in self._lineage if c >= manifest.checkpoint_id}
        log.info(
            "operator %r subtask %d: checkpoints now build on materialization %s (checkpoint %d)",
            self.operator_uid, self.subtask, manifest.mid, manifest.checkpoint_id,
        )
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loader is not None:
            self._loader.close()
            self._loader = None
        if self._writer is not None:
            for stream in self._streams.values():
                self._writer.close_stream(stream)
        self._working_set.close()


class PendingSnapshot:
    """The asynchronous part of a checkpoint of one subtask."""

    def __init__(
        self,
        backend: KeyedStateBackend,
        checkpoint_id: int,
        sealed: list[tuple[ChangelogStream, int]],
        futures: list[cf.Future[int]],
        base: Any,
    ) -> None:
        self.backend = backend
        self._base = base
        self.checkpoint_id = checkpoint_id
        self.sealed = sealed
        self._futures = futures
        self.started = time.monotonic()
        self._released = False
        self._release_lock = threading.Lock()

    def _release(self) -> None:
        with self._release_lock:
            if self._released:
                return
            self._released = True
        self.backend._snapshot_done()

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def cancel(self) -> None:
        """Abort: stop waiting and release the pending durability requests."""
        for f in self._futures:
            f.cancel()
        self._release()

    def result(self, timeout: float | None = None) -> SubtaskStateHandle:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for f in self._futures:
                f.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except cf.CancelledError:
            self._release()
            raise CheckpointAbortedError(
                f"checkpoint {self.checkpoint_id} of operator {self.backend.operator_uid!r} was cancelled"
            ) from None
        except cf.TimeoutError:
            raise CheckpointAbortedError(
                f"checkpoint {self.checkpoint_id}: the changelog of operator {self.backend.operator_uid!r} "
                f"subtask {self.backend.subtask} was not durable within {timeout}s"
            ) from None
        try:
            return self.backend._handle(self.sealed, self._base)
        finally:
            self._release()


__all__ = ["KeyedStateBackend", "PendingSnapshot", "SerializationError"]
