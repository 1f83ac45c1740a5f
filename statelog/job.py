"""The job facade: one object per job root and process.

It opens the store, checks the job descriptor, owns the process-wide changelog writer,
creates keyed backends (fresh or restored from a checkpoint), and publishes checkpoints::

    job = statelog.open("file:///var/lib/myjob")
    last = job.latest_checkpoint()
    backend = job.backend("counter", restore=last)
    counts = backend.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
    for offset, event in source.read_from(last.sources["events"] if last else 0):
        backend.set_current_key(event.user)
        counts.update(counts.value() + 1)
        if due:
            job.checkpoint(sources={"events": offset + 1})
"""

# size: the job facade, one method per job-level operation (each delegates to its module)
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from statelog.changelog.writer import ChangelogWriter
from statelog.checkpoint.catalog import JobCatalog, load_savepoint, parse_checkpoint_id
from statelog.checkpoint.history import CheckpointHistory
from statelog.checkpoint.metadata import CheckpointMetadata, SubtaskStateHandle
from statelog.checkpoint.pending import InflightCheckpoint, PendingCheckpoint
from statelog.checkpoint.publish import CheckpointPublisher
from statelog.checkpoint.root_lease import RootLease
from statelog.checkpoint.writer_lease import DEFAULT_WRITER_LEASE_TTL_S, check_writer_lease_ttl
from statelog.errors import ConfigError, FencedError
from statelog.keys.groups import check_parallelism, key_group_range_for_subtask
from statelog.loop_metrics import LoopMetrics, job_label
from statelog.materialization.adoption import MaterializationWatch
from statelog.materialization.manifest import Manifest
from statelog.options.engine import (
    DEFAULT_STATE_MEMORY,
    RETAIN,
    STATE_MEMORY,
    WriterOptions,
    check_state_dir,
    check_state_store,
)
from statelog.options.values import check_port, non_empty_name
from statelog.restore.changes import RestoredChanges
from statelog.restore.eager import read_restored
from statelog.restore.ondemand.loader import KeyGroupLoader
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.restore.plan import plan_restored, resolve_checkpoint
from statelog.restore.start import check_fresh_start, start_restore
from statelog.state.backend import KeyedStateBackend
from statelog.state.tables import disk as disk_tables  # DiskWorkingSet (rocksdict) on first use
from statelog.store import open_store
from statelog.store.base import ObjectStore
from statelog.store.fencing import FencedStore
from statelog.store.local_copies import LocalCopyStore, with_local_copies

if TYPE_CHECKING:
    from statelog.following.standby import Takeover
log = logging.getLogger(__name__)


def _check_arguments(
    metrics_port: Any, metrics_job: Any, writer_lease: bool, writer_lease_ttl_s: Any, writer_owner: Any
) -> int | None:
    """Check the arguments of :class:`StateJob` that it keeps no checked copy of (a clear error
    for a bad one); returns the metrics port (``None``: no server)."""
    port = check_port("metrics_port", metrics_port)
    if metrics_job is not None:
        non_empty_name("metrics_job", metrics_job)
    if writer_lease:
        check_writer_lease_ttl(writer_lease_ttl_s)
        if writer_owner is not None:
            non_empty_name("writer_owner", writer_owner)
    return port


class StateJob:
    """State storage of one job root, as seen from one process.

    Size: the facade of the engine for one process (backends, the writer lease, checkpoints,
    materializations, standby); each method delegates to the module that does the work.
    """

    def __init__(
        self,
        root: str,
        *,
        max_parallelism: int | None = None,
        store_options: Mapping[str, Any] | None = None,
        store: ObjectStore | None = None,
        retain_checkpoints: int = 5,
        writer_options: Mapping[str, Any] | WriterOptions | None = None,
        create: bool = True,
        recover_descriptor: bool = False,
        writer_lease: bool = True,
        writer_lease_ttl_s: float = DEFAULT_WRITER_LEASE_TTL_S,
        writer_owner: str | None = None,
        on_demand_restore: bool = True,
        state_store: str = "memory",
        state_memory: int | str = DEFAULT_STATE_MEMORY,
        state_dir: str | None = None,
        write_guard: Callable[[], None] | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        metrics_job: str | None = None,
        local_copies: bool | str | Mapping[str, Any] | None = None,
        standby: bool = False,
    ) -> None:
        metrics_port = _check_arguments(metrics_port, metrics_job, writer_lease, writer_lease_ttl_s, writer_owner)
        self.state_store = check_state_store("state_store", state_store)
        self.state_memory = STATE_MEMORY.check(state_memory)
        self.state_dir = check_state_dir("state_dir", state_dir)
        retain_checkpoints = RETAIN.check(retain_checkpoints)  # ranges: statelog/options/engine.py
        self.writer_options = WriterOptions.from_mapping(writer_options)  # names, defaults, ranges
        own_store = store is None
        inner = with_local_copies(store if store is not None else open_store(root, store_options), local_copies)
        self.local_copies = inner.copies if isinstance(inner, LocalCopyStore) else None
        # one checkpoint publisher per root: the lease is taken by the first backend or publish
        # (statelog/checkpoint/writer_lease.py); writer_lease=False only for processes that write
        # changelog under another process's lease (the runtime's workers)
        self._lease = RootLease(inner, writer_lease_ttl_s, writer_owner, self._on_fenced) if writer_lease else None
        # the lease holder's every write is checked: a process that lost the root writes nothing
        # (a process writing under another's lease, a runtime worker, passes its own check)
        write_guard = self._lease.check_writable if self._lease is not None else write_guard
        self.store = FencedStore(inner, write_guard) if write_guard is not None else inner
        self.root = self.store.url
        self.catalog = JobCatalog(self.store)
        self._backends: list[KeyedStateBackend] = []
        self.metrics = LoopMetrics(metrics_job or job_label(self.root), lambda: self._backends, lambda: self.fenced)
        self.metrics.local_copies = self.local_copies
        try:
            info = self.catalog.open_job(max_parallelism, create=create, recover=recover_descriptor)
            if metrics_port is not None:
                self.metrics.serve(metrics_host, metrics_port)
        except BaseException:
            if own_store:
                self.store.close()
            raise
        self.job_id, self.max_parallelism = info.job_id, info.max_parallelism
        self.retain_checkpoints = retain_checkpoints
        self.on_demand_restore = bool(on_demand_restore)  # key groups on first use (restore/ondemand/)
        self.on_demand_background = True  # False: key groups load only when touched (tests)
        self.on_demand_options = OnDemandOptions()  # the tuning of on-demand restores
        self.state_cache_entries: int | None = None  # a fixed cache size of disk backends (tests)
        self._checkpoints = CheckpointPublisher(self.catalog, self.job_id, self.max_parallelism, self._lease,
                                                self.metrics.history_fields)
        self._inflight = InflightCheckpoint()  # checkpoint_async's checkpoint still publishing
        self._writer: ChangelogWriter | None = None
        self._materializations = MaterializationWatch(self.store, log)
        self.materialization_poll_s = 1.0  # how often checkpoint() lists newer materializations
        self.takeover: Takeover | None = None  # standby=True: what it took over (statelog/following/standby.py)
        if standby:  # the follower's modules load for a standby only, not on a writer's start-up
            from statelog.following.standby import stand_by_job
            self.takeover = stand_by_job(self, store_options)

    def __repr__(self) -> str:
        # the store's repr hides credentials (statelog.store.options); nothing else here is secret
        return f"StateJob({self.root!r}, job_id={self.job_id!r}, store={self.store!r})"

    # -- writer and backends -------------------------------------------------------------------

    @property
    def writer(self) -> ChangelogWriter:
        if self._writer is None:
            self._writer = ChangelogWriter(self.store, self.writer_options)
        return self._writer

    @property
    def loading(self) -> bool:
        """A backend of this process is restoring key groups on demand."""
        return any(b.loading for b in self._backends)

    def poll_loading(self) -> None:
        """Install what the background loaders prepared (call it from the task thread)."""
        for b in self._backends:
            if b.loading:
                b.poll_loading()

    def flush_soon(self) -> None:
        """Start uploading the buffered changes of this process now (a checkpoint is coming);
        nothing happens before the first backend with a changelog opened the writer."""
        if self._writer is not None:
            self._writer.flush_soon()

    def backend(
        self,
        operator_uid: str,
        *,
        subtask: int = 0,
        parallelism: int = 1,
        restore: CheckpointMetadata | int | str | None = None,
        changelog: bool = True,
        clock: Callable[[], int] | None = None,
        on_demand: bool | None = None,
        state_store: str | None = None,
    ) -> KeyedStateBackend:
        """A keyed backend for one subtask, empty or restored from a checkpoint.

        ``restore`` is a checkpoint (metadata or id), ``"savepoint:NAME"``, ``"latest"``
        (empty if none exists), ``"none"`` (start empty, explicitly) or ``None``. ``None`` is
        refused with :class:`RestoreRequiredError` when the newest checkpoint of the root holds
        state of ``operator_uid``: starting empty there would silently drop that state (and
        replay the sources' output); say ``"latest"`` or ``"none"``. The restored state is the
        operator's state at that checkpoint restricted to this subtask's key groups, whatever
        the parallelism the checkpoint was taken with.

        ``on_demand`` (default: the job's ``on_demand_restore``) returns after reading only the
        checkpoint's handles, manifests and timers; each key group's state loads the first
        time a key of it is set, and a background thread loads the others
        (:mod:`statelog.restore.ondemand`; ``backend.wait_loaded()`` waits for all of them).

        ``state_store`` (default: the job's) is ``"memory"`` (the entries in Python dicts) or
        ``"disk"``: the entries in a local RocksDB database under a cache of the job's
        ``state_memory`` bytes, in a new directory under ``state_dir``
        (:mod:`statelog.state.tables.disk`; deleted at close, rebuilt from the checkpoint by a
        restore). Checkpoints, changelog and materializations are the same for both.
        """
        if not isinstance(operator_uid, str) or not operator_uid:
            raise ConfigError(f"operator uid must be a non-empty string, got {operator_uid!r}")
        check_parallelism(parallelism, self.max_parallelism)
        if changelog:
            self.acquire_writer_lease()
        kgr = key_group_range_for_subtask(self.max_parallelism, parallelism, subtask)
        disk = check_state_store("state_store", state_store or self.state_store) == "disk"
        if restore is None and self._checkpoints.last_id is None:
            # (a process that published checkpoints: its backends are the job's state)
            check_fresh_start(self.catalog, operator_uid)
        meta = self.resolve_checkpoint(restore)
        lazy = self.on_demand_restore if on_demand is None else on_demand
        restored, loader = None, None
        taken = self.takeover.take(self.store, self.writer, self._materializations.manifests, operator_uid, parallelism,
                                   meta, disk, clock) if self.takeover is not None and changelog else None
        if taken is not None:  # a standby's replica (statelog/following/standby.py): nothing is read
            self._backends.append(taken)
            return taken
        if meta is not None:
            restored, loader = start_restore(
                self.store, meta, operator_uid, kgr, self._materializations.manifests, on_demand=lazy, disk=disk,
                background=self.on_demand_background, options=self.on_demand_options,
            )  # fmt: skip
        ws = None
        if disk:
            ws = disk_tables.DiskWorkingSet(
                self.state_memory, self.state_dir, self.max_parallelism, f"{operator_uid}-{subtask}-",
                cache_entries=self.state_cache_entries,
            )
        b = KeyedStateBackend(
            operator_uid=operator_uid, subtask=subtask, parallelism=parallelism, max_parallelism=self.max_parallelism,
            writer=self.writer if changelog else None, stream_prefix=f"{operator_uid}.{subtask}.{_short_id()}",
            clock=clock, restored=restored, loader=loader, working_set=ws,
        )  # fmt: skip
        self._backends.append(b)
        if loader is not None and not lazy:
            b.wait_loaded()  # eager: every key group before returning
        return b

    def acquire_writer_lease(self) -> int | None:
        """Take the root's writer lease (once; later calls return the held generation).

        Raises :class:`LeaseHeldError` when another live process holds it, and
        :class:`LeaseLostError` once it was lost. ``None`` when opened with ``writer_lease=False``.
        """
        return self._lease.acquire() if self._lease is not None else None

    # -- losing the root (statelog/checkpoint/root_lease.py) -----------------------------------

    @property
    def fenced(self) -> FencedError | None:
        """Why this process lost the root for good (``None`` while it has not): see
        :class:`FencedError`. Every later write, checkpoint and backend of this job fails with it."""
        return self._lease.fenced if self._lease is not None else None

    def on_fenced(self, callback: Callable[[FencedError], None]) -> None:
        """Call ``callback(error)`` once, from the thread that notices, when this process loses
        the root (at once if it has); it must not block (set a flag, stop a loop)."""
        if self._lease is not None:
            self._lease.on_fenced(callback)

    def check_root(self) -> None:
        """Raise :class:`FencedError` if this process lost the root (one listing of the lease
        objects): call it before acting on the root after a failure (a restart, a sink's
        recovery). A job without a writer lease, or before taking it, passes."""
        if self._lease is not None:
            self._lease.check_root()

    def writer_lease_valid_until(self) -> float | None:
        """The wall-clock time (``time.time()``) until which the held writer lease is valid by
        this process's clock; ``None`` when it is not held."""
        return self._lease.valid_until() if self._lease is not None else None

    def _on_fenced(self, error: FencedError) -> None:
        if self._writer is not None:
            self._writer.fail(error)  # buffered changes are never uploaded; updates fail with it

    def resolve_checkpoint(self, which: CheckpointMetadata | int | str | None) -> CheckpointMetadata | None:
        """The metadata ``which`` names: ``None`` for ``None``, ``"none"``, or ``"latest"`` on
        a root without checkpoints. A checkpoint of another job (job id) is refused
        (:func:`statelog.restore.plan.resolve_checkpoint`)."""
        return resolve_checkpoint(self.catalog, which, job_id=self.job_id, max_parallelism=self.max_parallelism)

    def read_restored(self, meta: CheckpointMetadata, operator_uid: str, kgr: Any) -> RestoredChanges:
        """An eager restore: everything ``operator_uid`` holds in key groups ``kgr`` at ``meta``
        (:func:`statelog.restore.eager.read_restored`)."""
        return read_restored(self.store, meta, operator_uid, kgr, self._materializations.manifests)

    def plan_restored(
        self, meta: CheckpointMetadata, operator_uid: str, kgr: Any, disk: bool = False
    ) -> tuple[RestoredChanges, KeyGroupLoader | None]:
        """An on-demand restore: the handles' plan and the timers now, a loader for the rest
        (:func:`statelog.restore.plan.plan_restored`)."""
        return plan_restored(
            self.store, meta, operator_uid, kgr, self._materializations.manifests, disk=disk,
            background=self.on_demand_background, options=self.on_demand_options,
        )  # fmt: skip

    def load_savepoint(self, name: str) -> CheckpointMetadata:
        """The metadata of savepoint ``name`` (restore from it like from a checkpoint)."""
        return load_savepoint(self.store, name)

    # -- materializations ----------------------------------------------------------------------

    def latest_materialization(self, max_age_s: float = 0.0) -> Manifest | None:
        """The newest published materialization (listed at most every ``max_age_s`` seconds)."""
        return self._materializations.latest(max_age_s)

    def adopt_latest_materialization(self, max_age_s: float | None = None) -> Manifest | None:
        """Let every live backend build on the newest usable materialization, listed at most every
        ``max_age_s`` (default ``materialization_poll_s``) seconds (statelog.materialization.adoption)."""
        age = self.materialization_poll_s if max_age_s is None else max_age_s
        return self._materializations.adopt([b for b in self._backends if not b._closed], age)

    # -- checkpoints ---------------------------------------------------------------------------

    def next_checkpoint_id(self) -> int:
        return self._checkpoints.next_id()

    def checkpoint(self, sources: Mapping[str, Any] | None = None, *, timeout: float = 60.0) -> CheckpointMetadata:
        """Checkpoint every backend of this process with the given source positions (blocks).

        The synchronous part seals all streams at once, so the checkpoint is consistent with
        the source positions passed here; then it waits for durability and publishes
        (:mod:`statelog.checkpoint.publish`).
        """
        self._inflight.wait_previous(timeout)
        live = [b for b in self._backends if not b._closed]
        return self.metrics.timed_checkpoint(self._checkpoints.take, live, sources or {}, timeout,
                                             self.adopt_latest_materialization, self._writer, self.retain_checkpoints)

    def checkpoint_async(self, sources: Mapping[str, Any] | None = None, *, timeout: float = 60.0) -> PendingCheckpoint:
        """:meth:`checkpoint` that returns after the synchronous part (the streams sealed at
        these source positions): a thread waits for durability and publishes, while the loop
        goes on. At most one is in flight; the next checkpoint waits for it and raises its
        failure if nobody asked for it (:mod:`statelog.checkpoint.pending`)."""
        live = [b for b in self._backends if not b._closed]
        return self._inflight.start(self._checkpoints, live, sources or {}, timeout, self.adopt_latest_materialization,
                                    self._writer, self.retain_checkpoints, self.metrics)  # fmt: skip

    def publish_checkpoint(
        self,
        checkpoint_id: int,
        handles: list[SubtaskStateHandle],
        sources: Mapping[str, Any],
        stats: Mapping[str, Any] | None = None,
    ) -> CheckpointMetadata:
        """Write the metadata of a checkpoint whose handles are all durable, then apply retention."""
        return self._checkpoints.publish(checkpoint_id, handles, sources, stats, self._backends, self.retain_checkpoints)

    def checkpoints(self) -> list[CheckpointMetadata]:
        return [self.catalog.load(i) for i in self.catalog.checkpoint_ids()]

    @property
    def checkpoint_history(self) -> CheckpointHistory:
        """The root's checkpoint history (:mod:`statelog.checkpoint.history`), appended by this process."""
        return self._checkpoints.history

    def load_checkpoint(self, checkpoint_id: int | str) -> CheckpointMetadata:
        return self.catalog.load(parse_checkpoint_id(checkpoint_id))

    def latest_checkpoint(self) -> CheckpointMetadata | None:
        return self.catalog.latest()

    def close(self, flush: bool = True) -> None:
        self._inflight.close(flush and self.fenced is None)  # a checkpoint in flight publishes first
        self.metrics.close()
        for b in self._backends:
            b.close()
        self._backends.clear()
        try:
            if self._writer is not None:
                self._writer.close(flush=flush and self.fenced is None)
                self._writer = None
        finally:
            self._checkpoints.history.close()  # its waiting entries, under the lease (never raises)
            if self.takeover is not None:
                self.takeover.close()
            if self._lease is not None:
                self._lease.release()  # a successor may start at once
            self.store.close()

    def __enter__(self) -> StateJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _short_id() -> str:
    return uuid.uuid4().hex[:12]


def open_job(root: str, **kwargs: Any) -> StateJob:
    """Open (creating if needed) the job at ``root``; see :class:`StateJob` for options."""
    return StateJob(root, **kwargs)
