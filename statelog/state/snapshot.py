"""Checkpoints of one keyed backend: what they build on, and their asynchronous part.

A subtask's checkpoint is its states' changelog up to the positions
:meth:`KeyedStateBackend.snapshot <statelog.state.backend.KeyedStateBackend.snapshot>` seals,
on top of a base: the materialized parts the backend restored or adopted, and the changelog
ranges it inherited that no materialization covers yet. :class:`CheckpointBase` keeps that
base (and which materializations may replace it); :class:`PendingSnapshot` waits until the
sealed positions are durable and builds the subtask's state handle from what
:class:`SealedBase` captured at sealing time.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from statelog.changelog.stream import ChangelogStream
from statelog.checkpoint.metadata import ChangelogRange, MaterializedPart, SubtaskStateHandle
from statelog.descriptors import StateInfo
from statelog.errors import CheckpointAbortedError, StatelogError
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest
from statelog.restore.changes import RestoredChanges

log = logging.getLogger(__name__)

__all__ = ["CheckpointBase", "PendingSnapshot", "SealedBase"]


class CheckpointBase:
    """What the checkpoints of one backend build on.

    The materialized parts and the checkpoint they were taken at, the changelog positions
    they cover per stream, the inherited changelog ranges, and the completed checkpoints the
    backend's state descends from (a materialization of one of them may become the base).
    ``streams`` is the backend's own registry of changelog streams (name -> stream)."""

    def __init__(
        self,
        operator_uid: str,
        subtask: int,
        parallelism: int,
        key_groups: KeyGroupRange,
        streams: dict[str, ChangelogStream],
        restored: RestoredChanges,
    ) -> None:
        self.operator_uid = operator_uid
        self.subtask = subtask
        self.parallelism = parallelism
        self.key_groups = key_groups
        self._streams = streams
        self.inherited: tuple[ChangelogRange, ...] = tuple(restored.inherited)
        # the materialized base: parts of manifests, the checkpoint it was taken at, and the
        # changelog positions it covers (known when the backend adopted it)
        self.parts: tuple[MaterializedPart, ...] = tuple(restored.parts)
        self.checkpoint_id = restored.base_checkpoint_id
        self.covered: dict[str, int] = {}
        # completed checkpoints the backend's state descends from
        self.lineage: set[int] = set()
        if restored.checkpoint_id is not None:
            self.lineage.add(restored.checkpoint_id)
        self._pending = 0  # snapshots sealed but not completed or cancelled
        self._pending_lock = threading.Lock()

    def seal(self, states: Iterable[StateInfo]) -> SealedBase:
        """Capture the base of a checkpoint being sealed (on the task thread)."""
        with self._pending_lock:
            self._pending += 1
        return SealedBase(self, self.parts, self.inherited, dict(self.covered), tuple(states))

    def release(self) -> None:
        """A pending snapshot completed or was cancelled: segments it needed may go now."""
        with self._pending_lock:
            self._pending -= 1
            if self._pending == 0:
                self._forget_covered_segments()

    def _forget_covered_segments(self) -> None:
        """Drop the streams' references to segments the adopted base covers (memory only).

        Called with ``_pending_lock`` held and no snapshot pending: a pending snapshot's
        handle may still need segments before the new base (it was sealed on the old one).
        """
        for stream in self._streams.values():
            done = self.covered.get(stream.stream_id)
            if done:
                with stream.lock:
                    stream.segments = [seg for seg in stream.segments if seg.end > done]

    def adopt(self, manifest: Manifest) -> bool:
        """Build the next checkpoints on ``manifest`` plus only the changelog after it, if it is
        a materialization of a completed checkpoint the state descends from, newer than the
        current base, and holds this operator."""
        if manifest.checkpoint_id <= self.checkpoint_id or manifest.checkpoint_id not in self.lineage:
            return False
        mop = manifest.operators.get(self.operator_uid)
        if mop is None:
            return False
        covered = mop.covered
        inherited = []
        for r in self.inherited:
            done = covered.get(r.stream)
            if done is None:
                inherited.append(r)
            elif done < r.end:
                start = max(r.start, done)
                segs = tuple(s for s in r.segments if s.end > start)
                inherited.append(ChangelogRange(r.stream, start, r.end, r.key_groups, segs))
        self.parts = (manifest.reference(self.key_groups),)
        self.checkpoint_id = manifest.checkpoint_id
        self.inherited = tuple(inherited)
        self.covered = {s.stream_id: covered[s.stream_id] for s in self._streams.values() if s.stream_id in covered}
        with self._pending_lock:
            if self._pending == 0:  # else when the last pending snapshot is done
                self._forget_covered_segments()
        # a copy first: a checkpoint published in the background may add to it meanwhile
        self.lineage = {c for c in list(self.lineage) if c >= manifest.checkpoint_id}
        log.info(
            "operator %r subtask %d: checkpoints now build on materialization %s (checkpoint %d)",
            self.operator_uid, self.subtask, manifest.mid, manifest.checkpoint_id,
        )  # fmt: skip
        return True


@dataclass(frozen=True, eq=False)
class SealedBase:
    """The base of one checkpoint, captured on the task thread when it was sealed."""

    owner: CheckpointBase
    parts: tuple[MaterializedPart, ...]
    inherited: tuple[ChangelogRange, ...]
    covered: dict[str, int]
    states: tuple[StateInfo, ...]

    def handle(self, sealed: list[tuple[ChangelogStream, int]]) -> SubtaskStateHandle:
        """The subtask's state handle: this base plus each stream's records up to its sealed
        position (refused if a segment of them is not known)."""
        owner = self.owner
        ranges = list(self.inherited)
        for stream, pos in sealed:
            start = self.covered.get(stream.stream_id, 0)
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
                ranges.append(ChangelogRange(stream.stream_id, start, pos, owner.key_groups, segs))
        return SubtaskStateHandle(
            operator_uid=owner.operator_uid,
            subtask=owner.subtask,
            parallelism=owner.parallelism,
            key_groups=owner.key_groups,
            changelog=tuple(ranges),
            states=self.states,
            materialization=self.parts,
        )


class PendingSnapshot:
    """The asynchronous part of a checkpoint of one subtask (``backend``: the
    :class:`~statelog.state.backend.KeyedStateBackend` that sealed it)."""

    def __init__(
        self,
        backend: Any,
        checkpoint_id: int,
        sealed: list[tuple[ChangelogStream, int]],
        futures: list[cf.Future[int]],
        base: SealedBase,
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
        self._base.owner.release()

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
            return self._base.handle(self.sealed)
        finally:
            self._release()
