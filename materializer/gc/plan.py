"""Which objects a GC run deletes: the live set, the candidates, the rescan (steps 2 to 4).

:func:`plan_deletions` marks what the retained checkpoints, the savepoints and the recent
materializations reach, lists the objects below ``changelog/``, ``materializations/`` and the
prefixes of unpublished savepoints,
sorts them into kept (live), protected (recently superseded or younger than the grace period)
and candidates, rescans the checkpoints published meanwhile, and keeps every candidate that
unreadable metadata might reference. Nothing is deleted here (:mod:`materializer.gc.delete`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from materializer.gc.reachable import LiveSet, scan_live
from materializer.gc.report import Counts, category
from statelog.checkpoint.catalog import JobCatalog, savepoint_names
from statelog.layout import (
    CHANGELOG_PREFIX,
    MATERIALIZATIONS_PREFIX,
    SAVEPOINT_PREFIX,
    savepoint_metadata_key,
)
from statelog.store.base import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)


@dataclass
class GcPlan:
    """The outcome of the scans: what to delete, what is kept and protected, and why not more."""

    savepoints: list[str]
    live: LiveSet  # everything kept as referenced, with the errors of reading metadata
    candidates: dict[str, ObjectInfo]  # key -> object to delete
    kept: Counts  # live objects
    protected: Counts  # not live but recently superseded or younger than the grace period


def plan_deletions(
    store: ObjectStore, catalog: JobCatalog, retained: list[int], deleted_cids: list[int], cutoff: float,
    mode: str,
) -> GcPlan:
    """Steps 2 to 4 of a GC run after retention deleted ``deleted_cids`` and kept ``retained``;
    ``cutoff`` is now minus the grace period, ``mode`` the log lines' prefix."""
    # 2. live set: retained checkpoints, savepoints, newest (and recently superseded) materializations
    names = savepoint_names(store)
    live, recent = scan_live(store, retained, cutoff=cutoff)
    live.checkpoints |= set(deleted_cids)  # never rescanned: they no longer exist
    log.info(
        "%slive set: %d object(s) reached from %d checkpoint(s), %d savepoint(s) and %d manifest(s); "
        "%d recently superseded manifest(s) protected", mode, len(live.keys), len(retained), len(names),
        len(live.manifests), len(recent.manifests),
    )

    # 3. candidates: not live and older than the grace period
    kept, protected = Counts(), Counts()
    candidates: dict[str, ObjectInfo] = {}
    for prefix in (CHANGELOG_PREFIX, MATERIALIZATIONS_PREFIX):
        for obj in store.list(prefix):
            if obj.key in live.keys:
                kept.add(obj)
            elif obj.key in recent.keys or obj.mtime > cutoff:
                protected.add(obj)
            else:
                candidates[obj.key] = obj
    unpublished = _unpublished_savepoints(store, set(names), cutoff, candidates, protected)

    # 4. rescan right before deleting: checkpoints published since step 2 may reference
    # candidates (e.g. a backend adopted a materialization it listed before it was
    # superseded); so may a materialization published since (it reuses older files)
    if candidates:
        new_ids = [c for c in catalog.checkpoint_ids() if c not in live.checkpoints]
        late, late_recent = scan_live(store, new_ids, savepoints=False, cutoff=cutoff)
        if new_ids:
            log.info("%scheckpoint(s) %s published during GC: keeping what they reference", mode, new_ids)
        late.merge(late_recent)
        live.merge(late)
        for key in sorted(late.keys & candidates.keys()):
            kept.add(candidates.pop(key))
    # a savepoint published since step 2 is no leftover
    for name, keys in unpublished.items():
        if store.exists(savepoint_metadata_key(name)):
            log.info("%ssavepoint %r was published during GC: keeping it", mode, name)
            for key in keys:
                kept.add(candidates.pop(key))
    recent.errors = [e for e in recent.errors if e not in live.errors]
    live.merge(recent)

    # an unreadable checkpoint, savepoint or manifest: what it references is unknown, keep it all
    if live.unsafe_segments or live.unsafe_materializations:
        unsafe = [
            k for k in candidates
            if (category(k) == "segments" and live.unsafe_segments)
            or (category(k) != "segments" and live.unsafe_materializations)
        ]
        for key in unsafe:
            kept.add(candidates.pop(key))
        if unsafe:
            log.warning("%sGC keeps %d unreferenced object(s) because metadata could not be read",
                        mode, len(unsafe))
    return GcPlan(names, live, candidates, kept, protected)


def _unpublished_savepoints(
    store: ObjectStore, published: set[str], cutoff: float, candidates: dict[str, ObjectInfo], protected: Counts,
) -> dict[str, list[str]]:
    """Add the leftovers of unpublished savepoints to ``candidates``; returns them by name.

    Objects below ``savepoints/<name>/`` without ``savepoints/<name>/_metadata.json`` are
    the leftovers of a write that never published (or still runs). They go only all
    together, and only when the *newest* of them is older than the grace period: a writer
    in progress keeps the whole prefix protected by writing files or by refreshing its
    in-progress marker (``savepoints/<name>/_writing-<n>.json``, docs/format.md).
    """
    groups: dict[str, list[ObjectInfo]] = {}
    for obj in store.list(SAVEPOINT_PREFIX):
        name = obj.key[len(SAVEPOINT_PREFIX):].split("/", 1)[0]
        if name not in published:
            groups.setdefault(name, []).append(obj)
    out: dict[str, list[str]] = {}
    for name, objs in sorted(groups.items()):
        if max(o.mtime for o in objs) > cutoff:
            for o in objs:
                protected.add(o)
            continue
        for o in objs:
            candidates[o.key] = o
        out[name] = [o.key for o in objs]
    return out
