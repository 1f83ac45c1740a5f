"""Taking and publishing the checkpoints of one process's backends.

A checkpoint (:meth:`CheckpointPublisher.take`) seals every stream of every backend at once,
so it is consistent with the source positions given with it, waits until the sealed changes
are durable, then writes the checkpoint metadata under the writer lease's generation
(:meth:`CheckpointPublisher.publish`), tells the backends it completed and applies
retention. The runtime's job master publishes the handles its workers snapshotted the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from statelog.changelog.writer import ChangelogWriter
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.history import CheckpointHistory
from statelog.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorState,
    SubtaskStateHandle,
    encode_sources,
)
from statelog.checkpoint.root_lease import RootLease
from statelog.errors import StatelogError
from statelog.state.backend import KeyedStateBackend
from statelog.state.snapshot import PendingSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartedCheckpoint:
    """A checkpoint whose synchronous part is done: its id, the snapshots of its backends
    waiting for durability, when it started and how long its synchronous part took."""

    checkpoint_id: int
    pending: list[PendingSnapshot]
    t0: float
    sync_ms: float


class CheckpointPublisher:
    """Checkpoint ids, snapshots and publication for the job root of ``catalog``, under the
    process's writer ``lease`` (``None``: a process without one publishes no generation)."""

    def __init__(
        self, catalog: JobCatalog, job_id: str, max_parallelism: int, lease: RootLease | None,
        entry_fields: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.max_parallelism = max_parallelism
        self.lease = lease
        self.last_id: int | None = None  # the newest checkpoint this process published
        self._last_bytes_uploaded = 0
        self.history = CheckpointHistory(catalog.store)  # every checkpoint's stats, failed ones too
        # what the job adds to a completed checkpoint's history entry (a consumer loop's figures)
        self.entry_fields = entry_fields
        self._stream_ends: dict[str, int] = {}  # per changelog stream: its end at the last publish

    def next_id(self) -> int:
        """One more than the newest checkpoint of the root or of this process."""
        ids = self.catalog.checkpoint_ids()
        latest = ids[-1] if ids else 0
        if self.last_id is not None:
            latest = max(latest, self.last_id)
        return latest + 1

    def take(
        self,
        backends: list[KeyedStateBackend],
        sources: Mapping[str, Any],
        timeout: float,
        before_snapshot: Callable[[], object],
        writer: ChangelogWriter | None,
        retain: int,
    ) -> CheckpointMetadata:
        """Checkpoint ``backends`` (the live ones) at the ``sources`` positions and publish (blocks):
        ``before_snapshot`` runs once the lease and the id are taken (the job adopts a newer
        materialization there); ``writer`` is the backends' changelog writer, if opened."""
        started = self.begin(backends, sources, before_snapshot)
        return self.complete(started, backends, sources, timeout, writer, retain)

    def begin(
        self, backends: list[KeyedStateBackend], sources: Mapping[str, Any], before_snapshot: Callable[[], object]
    ) -> StartedCheckpoint:
        """The synchronous part of a checkpoint: check the sources and the lease, take an id,
        run ``before_snapshot`` and seal every stream of ``backends`` at once."""
        t0 = time.monotonic()
        encode_sources(dict(sources))  # a non-JSON position fails before anything is sealed
        if self.lease is not None:
            self.lease.acquire()  # a lost lease fails here, before anything is sealed
        cid = self.next_id()
        try:
            before_snapshot()
            pending = self.seal(backends, cid)
        except StatelogError as e:
            self.history.record_failure(cid, f"{type(e).__name__}: {e}")
            raise
        return StartedCheckpoint(cid, pending, t0, (time.monotonic() - t0) * 1000)

    def complete(
        self,
        started: StartedCheckpoint,
        backends: list[KeyedStateBackend],
        sources: Mapping[str, Any],
        timeout: float,
        writer: ChangelogWriter | None,
        retain: int,
    ) -> CheckpointMetadata:
        """The asynchronous part: wait until the sealed changes are durable, then publish."""
        cid = started.checkpoint_id
        try:
            handles, stats = self.wait_durable(started, timeout, writer)
            return self.publish(cid, handles, dict(sources), stats, backends, retain)
        except StatelogError as e:
            if self.last_id != cid:  # failed before its metadata was published
                self.history.record_failure(cid, f"{type(e).__name__}: {e}")
            raise

    def seal(self, backends: list[KeyedStateBackend], checkpoint_id: int) -> list[PendingSnapshot]:
        """Seal every stream of ``backends`` (all subtasks of their operators) at once."""
        by_uid: dict[str, list[KeyedStateBackend]] = {}
        for b in backends:
            by_uid.setdefault(b.operator_uid, []).append(b)
        for uid, bs in by_uid.items():
            subtasks = sorted(b.subtask for b in bs)
            if subtasks != list(range(bs[0].parallelism)):
                raise StatelogError(
                    f"operator {uid!r} has subtasks {subtasks} of parallelism {bs[0].parallelism} in this "
                    "process; a one-call checkpoint needs them all here (multi-process jobs publish "
                    "handles from a coordinator with StateJob.publish_checkpoint)"
                )
        return [b.snapshot(checkpoint_id) for b in backends]

    def wait_durable(
        self, started: StartedCheckpoint, timeout: float, writer: ChangelogWriter | None
    ) -> tuple[list[SubtaskStateHandle], dict[str, Any]]:
        """Wait until the sealed changes are durable: the handles, and the stats of the
        checkpoint (its times, and the changelog bytes uploaded since the previous one)."""
        try:
            handles = [p.result(timeout) for p in started.pending]
        except BaseException:
            for p in started.pending:
                p.cancel()
            raise
        async_ms = (time.monotonic() - started.t0) * 1000 - started.sync_ms
        uploaded = writer.bytes_uploaded if writer is not None else 0
        stats = {
            "sync_ms": round(started.sync_ms, 3),
            "async_ms": round(async_ms, 3),
            "incremental_bytes": uploaded - self._last_bytes_uploaded,
        }
        self._last_bytes_uploaded = uploaded
        return handles, stats

    def publish(
        self,
        checkpoint_id: int,
        handles: list[SubtaskStateHandle],
        sources: Mapping[str, Any],
        stats: Mapping[str, Any] | None,
        backends: Iterable[KeyedStateBackend],
        retain: int,
    ) -> CheckpointMetadata:
        """Write the metadata of a checkpoint whose handles are all durable (under the writer
        lease's generation), complete it in the included ``backends``, keep ``retain``
        checkpoints."""
        operators: dict[str, OperatorState] = {}
        grouped: dict[str, list[SubtaskStateHandle]] = {}
        for h in handles:
            grouped.setdefault(h.operator_uid, []).append(h)
        for uid, hs in grouped.items():
            hs.sort(key=lambda h: h.subtask)
            operators[uid] = OperatorState(uid, hs[0].parallelism, tuple(hs))
        # fencing, right before the publish
        generation = self.lease.generation() if self.lease is not None else None
        meta = CheckpointMetadata(
            checkpoint_id=checkpoint_id,
            job_id=self.job_id,
            timestamp_ms=int(time.time() * 1000),
            max_parallelism=self.max_parallelism,
            sources=dict(sources),
            operators=operators,
            stats=dict(stats or {}),
            writer_generation=generation,
        )
        size = self.catalog.publish(meta)
        self.last_id = checkpoint_id
        included = {(h.operator_uid, h.subtask, h.parallelism) for h in handles}
        for b in backends:
            if not b._closed and (b.operator_uid, b.subtask, b.parallelism) in included:
                b.checkpoint_completed(checkpoint_id)
        log.info(
            "checkpoint %d published (%d operators, %d bytes of metadata)", checkpoint_id, len(operators), size
        )
        extra = {k: v for k, v in (self.entry_fields() if self.entry_fields is not None else {}).items()
                 if k not in meta.stats}  # fmt: skip
        self.history.record_checkpoint(
            checkpoint_id, meta.stats, timestamp_ms=meta.timestamp_ms, delta_changes=self._delta_changes(handles),
            **extra,
        )
        self.catalog.apply_retention(retain)
        return meta

    def _delta_changes(self, handles: list[SubtaskStateHandle]) -> int | None:
        """The changelog records (state changes) written since this process's previous checkpoint
        (``None`` for its first: a stream's earlier records may come from before a restart)."""
        ends = {r.stream: r.end for h in handles for r in h.changelog}
        known = all(s in self._stream_ends for s in ends) and bool(self._stream_ends)
        delta = sum(max(0, end - self._stream_ends[s]) for s, end in ends.items()) if known else None
        self._stream_ends.update(ends)
        return delta
