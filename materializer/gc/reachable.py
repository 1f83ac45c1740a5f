"""What GC must keep: the objects a job root's checkpoints, savepoints and recent
materializations reach.

A :class:`LiveSet` collects the keys reached from checkpoint and savepoint metadata and from
manifests (with the files each lists); metadata it cannot read makes it mark segments or
table files as unsafe to delete. :func:`scan_live` builds the live set of a GC run (and of
its rescan), :func:`recent_manifests` finds the materializations superseded within the grace
period. The savepoint commands use the same marks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from statelog.checkpoint.catalog import JobCatalog, load_savepoint, savepoint_names
from statelog.checkpoint.metadata import CheckpointMetadata, MaterializedPart
from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    CheckpointNotFoundError,
    CorruptionError,
    SavepointNotFoundError,
    StoreError,
    StorePermissionError,
)
from statelog.layout import checkpoint_key, savepoint_metadata_key
from statelog.materialization.manifest import Manifest, list_manifests, load_manifest
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

# errors that concern the whole run, not one object: GC stops on them (a denied read or delete
# would be denied for every other object too)
FATAL_ERRORS = (AuthenticationError, BucketNotFoundError, StorePermissionError)


@dataclass
class LiveSet:
    """Object keys that must survive, and why the scan could not be completed (if so)."""

    keys: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)  # manifests whose files are in ``keys``
    checkpoints: set[int] = field(default_factory=set)  # checkpoint ids scanned
    errors: list[str] = field(default_factory=list)
    unsafe_segments: bool = False  # an unreadable checkpoint/savepoint: references unknown
    unsafe_materializations: bool = False  # an unreadable manifest: its files are unknown
    cache: dict[str, Manifest] = field(default_factory=dict, repr=False)  # parsed manifests

    def add_metadata(self, store: ObjectStore, meta: CheckpointMetadata) -> None:
        self.keys |= meta.segment_names()
        parts = {(p.manifest, p.bytes, p.crc32): p for op in meta.operators.values() for h in op.subtasks
                 for p in h.materialization}
        for part in sorted(parts.values(), key=lambda p: p.manifest):
            self.add_manifest(store, part, f"{meta.kind} {meta.checkpoint_id}", job_id=meta.job_id)

    def add_manifest(
        self, store: ObjectStore, ref: str | MaterializedPart, why: str, job_id: str | None = None
    ) -> None:
        """Keep a manifest and the files it lists; one that is not what ``ref`` references (or
        not of ``job_id``) makes GC keep every table file, as an unreadable one does."""
        key = ref if isinstance(ref, str) else ref.manifest
        self.keys.add(key)
        if key in self.manifests and isinstance(ref, str):
            return
        try:
            m = load_manifest(store, ref, self.cache, job_id=job_id)
        except FATAL_ERRORS:
            raise
        except (CorruptionError, StoreError) as e:
            self.unsafe_materializations = True
            self.errors.append(
                f"materialization manifest {key} ({why}) cannot be read: {e}; GC deleted no table "
                "file, since it cannot tell which ones that manifest lists (run `statelog verify ROOT`)"
            )
            return
        self.manifests.add(key)
        self.keys |= m.paths()

    def add_checkpoint(self, catalog: JobCatalog, cid: int) -> None:
        if cid in self.checkpoints:
            return
        self.checkpoints.add(cid)
        try:
            meta = catalog.load(cid)
        except CheckpointNotFoundError:
            log.info("checkpoint %d was removed by retention during GC", cid)
            return
        except FATAL_ERRORS:
            raise
        except (CorruptionError, StoreError) as e:
            self.unsafe_segments = self.unsafe_materializations = True
            self.errors.append(
                f"checkpoint metadata {checkpoint_key(cid)} cannot be read: {e}; GC deleted no "
                "segment or table file, since it cannot tell what that checkpoint references "
                "(run `statelog verify ROOT`; once the checkpoint is no longer retained, run gc again)"
            )
            return
        self.add_metadata(catalog.store, meta)

    def add_savepoint(self, store: ObjectStore, name: str) -> None:
        try:
            meta = load_savepoint(store, name)
        except SavepointNotFoundError:
            log.info("savepoint %r was deleted during GC", name)
            return
        except FATAL_ERRORS:
            raise
        except (CorruptionError, StoreError) as e:
            self.unsafe_segments = self.unsafe_materializations = True
            self.errors.append(
                f"savepoint metadata {savepoint_metadata_key(name)} cannot be read: {e}; GC deleted "
                "no segment or table file, since it cannot tell what that savepoint references "
                f"(run `statelog verify ROOT`; remove the savepoint with `statelog savepoint delete ROOT {name}` "
                "if it is damaged)"
            )
            return
        self.add_metadata(store, meta)

    @property
    def ok(self) -> bool:
        return not self.errors

    def merge(self, other: LiveSet) -> None:
        self.keys |= other.keys
        self.manifests |= other.manifests
        self.checkpoints |= other.checkpoints
        self.errors.extend(other.errors)
        self.unsafe_segments |= other.unsafe_segments
        self.unsafe_materializations |= other.unsafe_materializations


def recent_manifests(store: ObjectStore, cutoff: float) -> tuple[str | None, list[str]]:
    """The newest manifest, and the manifests that stopped being the newest after ``cutoff``.

    A manifest stops being the newest when the first manifest ordered after it (higher
    checkpoint id, then generation) appears; a backend that listed it just before may still
    adopt it in a checkpoint in flight.
    """
    ms = list_manifests(store)  # oldest first: (key, checkpoint id, generation, mtime)
    if not ms:
        return None, []
    recent = []
    first_after = ms[-1][3]  # the earliest mtime of the manifests ordered after the current one
    for key, _cid, _gen, mtime in reversed(ms[:-1]):
        if max(mtime, first_after) > cutoff:
            recent.append(key)
        first_after = min(first_after, mtime)
    return ms[-1][0], sorted(recent)


def scan_live(store: ObjectStore, checkpoint_ids: Iterable[int], *, savepoints: bool = True,
              cutoff: float = math.inf) -> tuple[LiveSet, LiveSet]:
    """The live set of the given checkpoints, every savepoint and the newest materialization.

    Also returns, separately, what the materializations superseded after ``cutoff`` (now minus
    the grace period) reach: those objects are kept too, as protected by the grace period.
    """
    catalog = JobCatalog(store)
    live = LiveSet()
    for cid in checkpoint_ids:
        live.add_checkpoint(catalog, cid)
    if savepoints:
        for name in savepoint_names(store):
            live.add_savepoint(store, name)
    newest, superseded = recent_manifests(store, cutoff)
    if newest is not None:
        live.add_manifest(store, newest, "the newest materialization")
    recent = LiveSet()
    for key in superseded:
        recent.add_manifest(store, key, "a recently superseded materialization")
    return live, recent
