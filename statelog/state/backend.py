"""The keyed state backend of one operator subtask: :class:`KeyedStateBackend`.

It holds the subtask's keyed state, scoped to a current key (and per state a namespace),
in the store of :mod:`statelog.state.tables`, and captures every mutation into a changelog
stream per state. Checkpoints come in two parts (:mod:`statelog.state.snapshot`):
:meth:`KeyedStateBackend.snapshot` seals every stream's position synchronously and returns a
:class:`~statelog.state.snapshot.PendingSnapshot`, whose ``result()`` waits until everything
up to those positions is durable and returns the subtask's state handle. Restored state is
installed by :class:`~statelog.restore.install.StateInstaller`, at once when a state
registers or key group by key group during an on-demand restore.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from statelog.changelog.stream import ChangelogStream
from statelog.changelog.writer import ChangelogWriter
from statelog.descriptors import (
    StateDescriptor,
    StateInfo,
    StateKind,
)
from statelog.errors import ConfigError, KeyGroupError, SerializationError, StatelogError
from statelog.keys.batch import encode_keys, key_groups_of
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes, key_group_range_for_subtask
from statelog.materialization.manifest import Manifest
from statelog.restore.changes import RestoredChanges
from statelog.restore.eager import restore_timers
from statelog.restore.install import StateInstaller
from statelog.restore.ondemand.loader import KeyGroupLoader
from statelog.state.context import NO_KEY, KeyContext
from statelog.state.keyed import KeyedState
from statelog.state.kinds import STATE_CLASSES
from statelog.state.rebind import rebind
from statelog.state.snapshot import CheckpointBase, PendingSnapshot
from statelog.state.tables import MemoryWorkingSet, WorkingSet
from statelog.state.timers import TIMER_INFOS, TimerService

if TYPE_CHECKING:
    from statelog.state.tables.disk import DiskWorkingSet


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class KeyedStateBackend:
    """Keyed state of one subtask of one operator, with optional changelog.

    The roles around it: its :class:`~statelog.state.context.KeyContext` is what the states
    and timers see of the current key; its store (:mod:`statelog.state.tables`) holds the
    entries; :class:`~statelog.state.snapshot.CheckpointBase` what its checkpoints build on;
    :class:`~statelog.restore.install.StateInstaller` turns restored state into entries,
    and a :class:`~statelog.restore.ondemand.loader.KeyGroupLoader` (on-demand restore) loads
    key groups on first touch and in the background.
    """

    set_current_key: Callable[[Any], None]
    """Scope all states to ``key``, which must belong to this subtask's key groups.

    It runs once per record, so it is the store's key setter
    (:meth:`statelog.state.tables.WorkingSet.key_setter`), bound per backend in ``__init__``
    and shared with the key context (the timer service sets a firing timer's key with it): a
    key in the key cache is made current with one dict lookup; any other key goes to
    :meth:`_admit_key`."""

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
        self._states: dict[str, KeyedState] = {}
        # states registered with a descriptor made from the stored state (a follower's replica
        # that became this writer: statelog.following.promote); get_state may give each its own once
        self.rebindable: set[str] = set()
        self.key_context = KeyContext(operator_uid, clock or wall_clock_ms, writer is not None)
        # the store of the states' entries: Python dicts unless given (the disk-backed working
        # set of state_store="disk"); its key cache is this backend's
        store = working_set if working_set is not None else MemoryWorkingSet()
        store.attach(self.key_context)
        self._working_set: WorkingSet = store
        self._kcache = store.key_cache
        # the disk store itself (None in memory): a restore bulk-loads into its database
        self._ws: DiskWorkingSet | None = store if store.on_disk else None  # type: ignore[assignment]
        self.set_current_key = self.key_context.set_current_key = store.key_setter(self.key_context, self._admit_key)
        self.key_context.batch_keys = functools.partial(batch_keys, self)
        restored = restored or RestoredChanges()
        self._restored = restored
        self._installer = StateInstaller(self.key_context, subtask, self._states, restored, self._ws)
        self._checkpoints = CheckpointBase(operator_uid, subtask, parallelism, self.key_groups, self._streams, restored)
        self.timers = TimerService(
            self.key_context,
            (self._open_stream(TIMER_INFOS[0], True), self._open_stream(TIMER_INFOS[1], True)),
        )
        restore_timers(restored, self.timers, self._installer.check_keys)
        self._closed = False
        # on-demand restore (statelog/restore/ondemand/): key groups not loaded yet load on first touch
        self._loader = loader
        self.restore_stats: dict[str, Any] = self._installer.stats
        self.key_context.load_all = self.wait_loaded
        if loader is not None:
            self._installer.start(loader)

    # -- current key ---------------------------------------------------------------------------

    def _admit_key(self, key: Any) -> None:
        """Make ``key``, which is not in the key cache, current: encode it, check its key
        group, load its key group (on-demand restore) and put it into the key cache."""
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

    def size_figures(self) -> dict[str, int]:
        """Figures for metrics: :func:`size_figures`."""
        return size_figures(self)

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
            if descriptor.name in self.rebindable and existing.descriptor != descriptor:
                rebind(existing, descriptor, existing._stream)
            self.rebindable.discard(descriptor.name)
            if existing.descriptor != descriptor:
                raise ConfigError(
                    f"state {descriptor.name!r} of operator {self.operator_uid!r} is already registered "
                    "with a different descriptor"
                )
            return existing
        cls = STATE_CLASSES.get(type(descriptor))
        if cls is None:
            raise ConfigError(f"unsupported state descriptor type {type(descriptor).__name__}")
        self._installer.check_compatible(descriptor)
        info = StateInfo.from_descriptor(descriptor)
        narrow = info.ttl is None and info.kind in (
            StateKind.VALUE, StateKind.REDUCING, StateKind.AGGREGATING
        )
        state = cls(self.key_context, descriptor, self._open_stream(info, narrow))
        self._states[descriptor.name] = state
        self._installer.replay(state)
        return state

    def legacy_key_error(self, state: str, kb: bytes) -> SerializationError:
        """The error for a restored key (or namespace) in key encoding version 1 that version 2
        encodes differently (:meth:`KeyContext.legacy_key_error`)."""
        return self.key_context.legacy_key_error(state, kb)

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

    # -- on-demand restore (statelog/restore/ondemand/) ----------------------------------------

    def _load_key_group(self, kg: int | None, kb: bytes | None = None) -> None:
        """Install what the loader prepared, and key group ``kg`` (preparing it if needed), or
        only the slice of it that holds key bytes ``kb``."""
        assert self._loader is not None
        if self._installer.load(self._loader, kg, kb):
            self._loader = None

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
        if self._loader is not None:
            self._installer.load_all(self._loader)
            self._loader = None

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
        return PendingSnapshot(self, checkpoint_id, sealed, futures, self._checkpoints.seal(self.state_infos()))

    @property
    def base_checkpoint_id(self) -> int | None:
        """The checkpoint of the materialization this backend's checkpoints build on, if any."""
        base = self._checkpoints
        return base.checkpoint_id if base.parts else None

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """Note that a checkpoint including this backend's snapshot was published."""
        self._checkpoints.lineage.add(checkpoint_id)

    def adopt_materialization(self, manifest: Manifest) -> bool:
        """Build the next checkpoints on ``manifest`` plus only the changelog after it.

        Only a materialization of a completed checkpoint that this backend's state descends
        from qualifies (not, e.g., one taken by an earlier run after the checkpoint this
        backend was restored from), and only if it is newer than the current base.
        Call it from the task thread, between records (the runtime does so before a snapshot).
        """
        if self._loader is not None:  # key groups not loaded yet still need the restored handles
            return False
        return self._checkpoints.adopt(manifest)

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


def batch_keys(backend: KeyedStateBackend, keys: Any, int_column: bool = False) -> tuple[Any, pa.Array, np.ndarray]:
    """The keys of a batch call (an Arrow array or a Python sequence) as ``(python keys,
    encoded keys, key groups)``, computed a column at a time (:mod:`statelog.keys.batch`),
    after the checks and loads of :meth:`KeyedStateBackend._admit_key`: every key must be in this subtask's
    key groups (else :class:`KeyGroupError` names the first that is not), their key groups
    are loaded first during an on-demand restore, and the disk-backed working set reads the
    keys not resident in one batched read (``int_column``: an int column's keys as int64s)."""
    pykeys, kbs = encode_keys(keys, int_column)
    kgs = key_groups_of(kbs, backend.max_parallelism)
    if len(kgs) == 0:
        return pykeys, kbs, kgs
    outside = (kgs < backend._kg_lo) | (kgs > backend._kg_hi)
    if isinstance(pykeys, np.ndarray) and (backend._ws is not None or outside.any()):
        pykeys = pykeys.tolist()  # (the disk-backed working set and the error take Python keys)
    if outside.any():
        i = int(np.argmax(outside))
        raise KeyGroupError(
            f"key {pykeys[i]!r} is in key group {int(kgs[i])}, which operator {backend.operator_uid!r} subtask "
            f"{backend.subtask} of {backend.parallelism} does not own (it owns {backend.key_groups}); route "
            "records by statelog.subtask_for_key_group(max_parallelism, parallelism, kg)"
        )
    if backend._loader is not None:
        for kg in np.unique(kgs).tolist():
            if backend._loader is None:
                break
            backend._load_key_group(kg)
    if backend._ws is not None:
        backend._working_set.prefetch(pykeys, backend._kg_lo, backend._kg_hi)
    return pykeys, kbs, kgs


def size_figures(backend: KeyedStateBackend) -> dict[str, int]:
    """Figures for metrics, cheap enough for every scrape: ``entries`` (entries of the
    keyed states in memory: every entry with the memory store, none counted with the disk
    store, whose entries are in its database), with the disk store ``disk_bytes`` (its
    database's files), ``cache_hits`` (keys set current that were resident in the working
    set's memory: :meth:`DiskWorkingSet.key_hits
    <statelog.state.tables.disk.working_set.DiskWorkingSet.key_hits>`), ``cache_misses`` (reads
    of its database for keys not resident, on demand or by a prefetch) and
    ``cache_entry_misses`` (reads of its database for namespaced entries not cached; their
    hits are not counted: each costs a dict lookup)."""
    ws = backend._ws
    if ws is not None:
        entry = int(ws.entry_misses)
        return {"disk_bytes": ws.disk_bytes(), "cache_hits": ws.key_hits(), "cache_misses": int(ws.misses) - entry,
                "cache_entry_misses": entry}  # fmt: skip
    entries = 0
    for state in list(backend._states.values()):
        entries += sum(len(t) for t in list(state._tables.values()))
    return {"entries": entries}


__all__ = ["KeyedStateBackend"]
