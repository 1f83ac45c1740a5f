"""The hot standby: ``statelog.open(root, standby=True)``.

:func:`stand_by` runs a :class:`~statelog.following.follower.Follower` of the root (the
working set the job's backends would use, consistency ``"checkpoint"``, restored at once:
fully loaded before it takes over) and tries to take the writer lease until it is free: released by a clean close, or expired (a holder that
stopped renewing; at once when the holder was a process of this host that is gone). Once
the lease is held no other process can publish a checkpoint, so the follower's last poll
(:func:`hand_over`), made under the lease, catches up
with any checkpoint published between its previous poll and the takeover; its replicas are
then exactly the newest completed checkpoint. :class:`Takeover` hands each replica to
:meth:`StateJob.backend <statelog.job.StateJob.backend>` as the operator's writing backend
(:func:`statelog.following.promote.attach_changelog`): no state is read again, so the first
record after the takeover waits for the lease only.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statelog.changelog.reader import SegmentReader
from statelog.changelog.writer import ChangelogWriter
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.checkpoint.root_lease import RootLease
from statelog.errors import ConfigError, LeaseHeldError
from statelog.following.follower import Follower
from statelog.following.promote import attach_changelog
from statelog.following.replica import OperatorReplica
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest
from statelog.restore.plan import handles_of, plan_reads
from statelog.state.backend import KeyedStateBackend
from statelog.store.base import ObjectStore

__all__ = ["DEFAULT_STANDBY_POLL_S", "Takeover", "hand_over", "stand_by", "stand_by_job"]

log = logging.getLogger(__name__)

DEFAULT_STANDBY_POLL_S = 0.5  # the follower's polls for new checkpoints
LEASE_POLL_S = 0.01  # the lease's listings while a holder is observed: the takeover's latency after it frees


def hand_over(follower: Follower) -> tuple[CheckpointMetadata | None, dict[str, OperatorReplica]]:
    """Stop ``follower`` polling, move it to the newest completed checkpoint one last time, and
    take its replicas: the checkpoint and, per operator, the replica whose state is exactly that
    checkpoint's (replicas with flushed changes beyond it are closed, not taken). The follower
    is closed afterwards; the caller closes the replicas."""
    follower._stop.set()
    if follower._thread is not None:
        follower._thread.join()
    try:
        with follower._poll_lock, follower._lock:
            ids = follower._catalog.checkpoint_ids()  # (one listing: a checkpoint published since its last poll?)
            if follower._meta is None or not ids or ids[-1] != follower._meta.checkpoint_id:
                follower._poll_once()
            meta, replicas = follower._meta, dict(follower._replicas)
            follower._replicas.clear()
    finally:
        follower.close()
    if meta is not None:
        for uid, rep in list(replicas.items()):
            if rep.ahead_of(meta):
                log.info("standby of %s: operator %r has flushed changes beyond checkpoint %d; restored instead",
                         follower.root, uid, meta.checkpoint_id)
                replicas.pop(uid).close()
    return meta, replicas


@dataclass
class Takeover:
    """What a standby took over: the checkpoint its replicas are exactly at (``None``: the
    root had none), the replicas per operator not handed to a backend yet, when the lease was
    acquired (``time.time()``) and how long the standby waited for it."""

    meta: CheckpointMetadata | None
    replicas: dict[str, OperatorReplica] = field(default_factory=dict)
    acquired_at: float = 0.0
    waited_s: float = 0.0

    def take(
        self, store: ObjectStore, writer: ChangelogWriter, manifests: dict[str, Manifest], operator_uid: str,
        parallelism: int, wanted: CheckpointMetadata | None, disk: bool, clock: Callable[[], int] | None,
    ) -> KeyedStateBackend | None:
        """The replica of ``operator_uid`` as a writing backend, when it is exactly what the
        caller asked for (one subtask over every key group, restored from checkpoint
        ``wanted``, in the same working set); ``None`` otherwise (the replica is dropped and
        the caller restores as usual)."""
        rep = self.replicas.pop(operator_uid, None)
        if rep is None:
            return None
        meta = self.meta
        if (meta is None or wanted is None or wanted.checkpoint_id != meta.checkpoint_id or parallelism != 1
                or rep.backend.on_disk != disk):
            log.info("standby: the replica of operator %r is not what was asked for (checkpoint %s, "
                     "parallelism %d): restoring it instead", operator_uid,
                     None if wanted is None else wanted.checkpoint_id, parallelism)  # fmt: skip
            rep.close()
            return None
        kgr = KeyGroupRange(0, meta.max_parallelism - 1)
        base, _files, _ranges = plan_reads(SegmentReader(store), handles_of(meta, operator_uid, kgr), kgr, manifests,
                                           job_id=meta.job_id)  # (manifests only: no state is read)
        if meta.kind == "checkpoint":
            base.checkpoint_id = meta.checkpoint_id
        backend = rep.backend
        attach_changelog(backend, writer, f"{operator_uid}.0.{uuid.uuid4().hex[:12]}", base)
        if clock is not None:
            backend.key_context.clock = clock
        backend.restore_stats.update(standby=True, checkpoint_id=meta.checkpoint_id)
        log.info("standby: operator %r continues from its replica at checkpoint %d", operator_uid, meta.checkpoint_id)
        return backend

    def close(self) -> None:
        """Drop the replicas no backend took."""
        for rep in self.replicas.values():
            rep.close()
        self.replicas.clear()


def stand_by_job(job: Any, store_options: Mapping[str, Any] | None) -> Takeover:
    """:func:`stand_by` for :class:`~statelog.job.StateJob` ``job`` (``standby=True``), with
    its lease and working set; ``job`` is closed when it fails."""
    if job._lease is None:
        job.close(flush=False)
        raise ConfigError("standby=True takes the writer lease over: it needs writer_lease=True")
    try:
        return stand_by(job.root, job._lease, store_options=store_options, state_store=job.state_store,
                        state_memory=job.state_memory, state_dir=job.state_dir)
    except BaseException:
        job.close(flush=False)
        raise


def stand_by(
    root: str, lease: RootLease, *, store_options: Mapping[str, Any] | None, state_store: str, state_memory: int,
    state_dir: str | None, poll_s: float | None = None,
) -> Takeover:
    """Follow ``root`` until its writer lease is free, take it, and return the replicas at the
    newest completed checkpoint (module docstring). Blocks until then."""
    started = time.monotonic()
    follower = Follower(root, store_options=store_options, consistency="checkpoint", state_store=state_store,
                        state_memory=state_memory, state_dir=state_dir, on_demand=False,  # (fully loaded before it takes over)
                        poll_s=DEFAULT_STANDBY_POLL_S if poll_s is None else poll_s)  # fmt: skip
    try:
        log.info("standby of %s: following (checkpoint %s) until the writer lease is free", root,
                 follower.checkpoint_id)
        lease.poll_s = LEASE_POLL_S
        while True:
            try:
                lease.acquire()
                break
            except LeaseHeldError:
                continue  # (acquire observed a live holder for a while: observe again)
        acquired, acquired_wall = time.monotonic(), time.time()
    except BaseException:
        follower.close()
        raise
    meta, replicas = hand_over(follower)
    log.info("standby of %s: took the writer lease after %.3fs at checkpoint %s", root, acquired - started,
             None if meta is None else meta.checkpoint_id)
    return Takeover(meta, replicas, acquired_wall, acquired - started)
