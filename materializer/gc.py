"""Garbage collection of a job root: delete what no retained checkpoint or savepoint needs.

Rules (``docs/gc.md``):

1. **Retention** (only with ``retain_checkpoints``): delete the metadata of all but the newest
   N checkpoints, oldest first. From that moment those checkpoints no longer exist.
2. **Live set**: every object that a retained checkpoint references (changelog segments,
   materialization manifests and every table file each manifest lists, also files it reuses
   from older materializations or savepoints), every savepoint (metadata, manifest, files),
   the newest published materialization (a backend may adopt it at its next checkpoint) and
   every materialization that was the newest less than ``grace_s`` ago (a backend may have
   listed it just before it was superseded and adopt it in a checkpoint still in flight).
3. **Candidates**: objects below ``changelog/`` and ``materializations/`` that are not live
   and whose mtime is older than ``grace_s``. Younger ones are *protected by grace*: segments
   of running writers that no checkpoint references yet, and table files of a
   materialization whose manifest is not written yet.
4. **Rescan**: right before deleting, list the checkpoints (and the newest materialization)
   again; whatever a checkpoint published since the first scan references is removed from
   the candidates.
5. **Delete**: manifests first, then table files, then segments. Nothing else is ever
   deleted: not ``job.json``, not the lease objects below ``materializer/``, nothing below
   ``savepoints/`` (savepoints are removed only by ``delete_savepoint``).

Why a crash never hurts: checkpoint metadata goes first, so a retained checkpoint never
loses an object it references (the objects deleted afterwards are unreachable from every
checkpoint that still exists). A manifest goes before its files, so every manifest that
exists still lists only existing files; files left behind by a crash are unreachable and the
next run deletes them.

Why concurrent publications are safe: a new reference to an *old* object can only come from
(a) a checkpoint published after the first scan: the rescan sees every checkpoint published
before the deletion starts, and one published later references segments written since the
previous checkpoint of its writer (younger than the grace period if the grace period exceeds
the checkpoint interval plus a checkpoint's duration) or the materialization its backends
adopted, which was the newest one when they listed it and is therefore live or protected as
"recently superseded"; (b) a materialization in progress: its new files are younger than
the grace period (if the grace period exceeds the longest materialization), the files it
reuses belong to the base of a retained checkpoint. Objects deleted are thus objects that
nothing references and nothing will reference (DESIGN invariant 4), provided the grace period
covers those durations and the clock skew between this host and the store.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from statelog.checkpoint.catalog import JobCatalog, load_savepoint, savepoint_names
from statelog.checkpoint.metadata import CheckpointMetadata, MaterializedPart
from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptionError,
    SavepointNotFoundError,
    StoreError,
    StorePermissionError,
)
from statelog.layout import (
    CHANGELOG_PREFIX,
    MATERIALIZATIONS_PREFIX,
    ObjectKind,
    checkpoint_key,
    parse_key,
    savepoint_metadata_key,
)
from statelog.materialization.manifest import Manifest, list_manifests, load_manifest
from statelog.store.base import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 600.0
CATEGORIES = ("segments", "manifests", "table_files", "other")
# errors that concern the whole run, not one object: GC stops on them (a denied read or delete
# would be denied for every other object too)
_FATAL = (AuthenticationError, BucketNotFoundError, StorePermissionError)


_CATEGORY = {ObjectKind.SEGMENT: "segments", ObjectKind.MANIFEST: "manifests", ObjectKind.TABLE: "table_files"}


def category(key: str) -> str:
    """The report category of an object GC may delete, by what :func:`statelog.layout.parse_key`
    says it is: ``"other"`` for a key no statelog module writes."""
    parsed = parse_key(key)
    return "other" if parsed is None else _CATEGORY.get(parsed.kind, "other")


@dataclass(frozen=True)
class Tally:
    """Objects and bytes of one category."""

    objects: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class GcReport:
    """What one GC run found and did (or, with ``dry_run``, would do)."""

    root: str
    dry_run: bool
    now: float
    grace_s: float
    retain_checkpoints: int | None
    checkpoints_retained: tuple[int, ...]
    checkpoints_deleted: tuple[int, ...]
    savepoints: tuple[str, ...]
    deleted: dict[str, Tally]  # category -> objects and bytes deleted
    kept: dict[str, Tally]  # category -> live objects
    protected: dict[str, Tally]  # category -> not live but younger than the grace period
    deleted_keys: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def objects_deleted(self) -> int:
        return sum(t.objects for t in self.deleted.values())

    @property
    def bytes_deleted(self) -> int:
        return sum(t.bytes for t in self.deleted.values())

    def to_json(self) -> dict[str, Any]:
        def tallies(d: dict[str, Tally]) -> dict[str, Any]:
            return {c: asdict(d.get(c, Tally())) for c in CATEGORIES}

        return {
            "ok": self.ok,
            "root": self.root,
            "dry_run": self.dry_run,
            "now": self.now,
            "grace_s": self.grace_s,
            "retain_checkpoints": self.retain_checkpoints,
            "checkpoints_retained": list(self.checkpoints_retained),
            "checkpoints_deleted": list(self.checkpoints_deleted),
            "savepoints": list(self.savepoints),
            "deleted": tallies(self.deleted),
            "kept": tallies(self.kept),
            "protected": tallies(self.protected),
            "objects_deleted": self.objects_deleted,
            "bytes_deleted": self.bytes_deleted,
            "deleted_keys": list(self.deleted_keys),
            "errors": list(self.errors),
            "duration_s": round(self.duration_s, 3),
        }


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
        except _FATAL:
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
        except _FATAL:
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
        except _FATAL:
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


# a manifest before the files it lists, so every manifest that exists stays complete
_DELETION_ORDER = {"manifests": 0, "table_files": 1, "other": 2, "segments": 3}


class _Counts:
    """Objects and bytes per category while GC runs."""

    def __init__(self) -> None:
        self.d: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}

    def add(self, obj: ObjectInfo) -> None:
        t = self.d[category(obj.key)]
        t[0] += 1
        t[1] += obj.size

    def tallies(self) -> dict[str, Tally]:
        return {c: Tally(*v) for c, v in self.d.items()}

    def objects(self, cat: str | None = None) -> int:
        return sum(v[0] for c, v in self.d.items() if cat in (None, c))


def _denied(e: StorePermissionError, deleted: int) -> StorePermissionError:
    """The error that ends a GC run at its first delete refused for lack of permission."""
    return StorePermissionError(
        f"GC stopped at the first delete the store refused ({deleted} object(s) deleted before it, "
        f"none after it): {e}", key=e.key,
    )


def collect_garbage(
    store: ObjectStore,
    *,
    retain_checkpoints: int | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Delete checkpoints beyond the newest ``retain_checkpoints`` and unreachable objects.

    Deletes only objects below ``changelog/`` and ``materializations/`` that no retained
    checkpoint, savepoint or recent materialization reaches and whose mtime is older than
    ``grace_s`` seconds before ``now`` (default: the current time). With ``dry_run`` nothing
    is deleted and the report says what would be. See the module docstring for the rules.
    Errors reading metadata or deleting objects are reported (``GcReport.errors``) and make
    GC keep whatever they might concern. Refused credentials, a missing bucket and a denied
    permission raise: the first delete the store refuses for lack of permission ends the run
    with a :class:`StorePermissionError` naming the object and the permission, and nothing
    is deleted after it.
    """
    t0 = time.monotonic()
    if retain_checkpoints is not None and (type(retain_checkpoints) is not int or retain_checkpoints < 1):
        raise ConfigError(
            f"retain_checkpoints must be an integer >= 1 (or None to keep every checkpoint), got "
            f"{retain_checkpoints!r}"
        )
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or not 0 <= grace_s < math.inf:
        raise ConfigError(f"grace_s must be a finite number of seconds >= 0, got {grace_s!r}")
    now = time.time() if now is None else float(now)
    cutoff = now - grace_s
    catalog = JobCatalog(store)
    catalog.open_job(None, create=False)  # a root without job.json is an error, never created
    mode = "dry run: " if dry_run else ""
    errors: list[str] = []

    # 1. retention: checkpoint metadata first, oldest first
    ids = catalog.checkpoint_ids()
    doomed = ids[:-retain_checkpoints] if retain_checkpoints is not None else []
    retained = ids[len(doomed):]
    deleted_cids: list[int] = []
    for cid in doomed:
        try:
            if not dry_run:
                catalog.delete(cid)
            deleted_cids.append(cid)
        except StorePermissionError as e:
            raise _denied(e, len(deleted_cids)) from None
        except _FATAL:
            raise
        except StoreError as e:
            errors.append(f"could not delete checkpoint metadata {checkpoint_key(cid)}: {e}")
            retained.append(cid)  # it still exists: keep what it references
    retained.sort()
    if deleted_cids:
        log.info("%sretention: deleted checkpoint metadata %s (keeping the newest %d)",
                 mode, deleted_cids, retain_checkpoints)

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
    kept, protected = _Counts(), _Counts()
    candidates: dict[str, ObjectInfo] = {}
    for prefix in (CHANGELOG_PREFIX, MATERIALIZATIONS_PREFIX):
        for obj in store.list(prefix):
            if obj.key in live.keys:
                kept.add(obj)
            elif obj.key in recent.keys or obj.mtime > cutoff:
                protected.add(obj)
            else:
                candidates[obj.key] = obj

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
    recent.errors = [e for e in recent.errors if e not in live.errors]
    live.merge(recent)
    errors.extend(live.errors)

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

    # 5. delete: manifests before the files they list, segments last
    deleted = _Counts()
    deleted_keys: list[str] = []
    for key in sorted(candidates, key=lambda k: (_DELETION_ORDER[category(k)], k)):
        obj = candidates[key]
        if not dry_run:
            try:
                store.delete(key)
            except StorePermissionError as e:
                raise _denied(e, len(deleted_cids) + len(deleted_keys)) from None
            except _FATAL:
                raise
            except StoreError as e:
                errors.append(f"could not delete {key}: {e}")
                continue
        log.debug("%sdeleted %s (%d bytes, %.0fs old)", mode, key, obj.size, now - obj.mtime)
        deleted.add(obj)
        deleted_keys.append(key)

    report = GcReport(
        root=store.url,
        dry_run=dry_run,
        now=now,
        grace_s=float(grace_s),
        retain_checkpoints=retain_checkpoints,
        checkpoints_retained=tuple(c for c in retained if c not in deleted_cids),
        checkpoints_deleted=tuple(deleted_cids),
        savepoints=tuple(names),
        deleted=deleted.tallies(),
        kept=kept.tallies(),
        protected=protected.tallies(),
        deleted_keys=tuple(deleted_keys),
        errors=tuple(errors),
        duration_s=time.monotonic() - t0,
    )
    log.info(
        "%sGC of %s: deleted %d checkpoint(s), %d segment(s), %d manifest(s), %d table file(s), "
        "%d other object(s), %d bytes in all; kept %d live object(s); %d object(s) protected by the "
        "%gs grace period; %d error(s) in %.2fs",
        mode, store.url, len(deleted_cids), deleted.objects("segments"), deleted.objects("manifests"),
        deleted.objects("table_files"), deleted.objects("other"), report.bytes_deleted, kept.objects(),
        protected.objects(), grace_s, len(errors), report.duration_s,
    )
    for e in errors:
        log.warning("GC: %s", e)
    return report


__all__ = ["DEFAULT_GRACE_S", "GcReport", "LiveSet", "Tally", "collect_garbage", "scan_live"]
