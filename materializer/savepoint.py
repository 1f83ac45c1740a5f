"""Savepoints: user-triggered, self-contained images of a checkpoint that GC never deletes.

Layout below the job root (``docs/gc.md``)::

    savepoints/<name>/data/<materialization id>/<file>.parquet   state tables (all rewritten)
    savepoints/<name>/manifest.json                             manifest, kind "savepoint"
    savepoints/<name>/_metadata.json                            checkpoint metadata, kind "savepoint"

:func:`create_savepoint` writes the tables, then the manifest, then the metadata: the
savepoint exists once its metadata exists (like a checkpoint). Its handles build only on the
savepoint's own manifest (no changelog), so it needs no other object of the job and a
restore from it (``job.backend(uid, restore="savepoint:NAME")``) works at any parallelism.
:func:`delete_savepoint` removes the metadata first, then the files.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from materializer.build import MaterializeOptions, Materializer
from materializer.gc.reachable import LiveSet, recent_manifests
from statelog.checkpoint.catalog import (
    JobCatalog,
    load_savepoint,
    parse_checkpoint_id,
    savepoint_names,
)
from statelog.checkpoint.metadata import (
    CheckpointMetadata,
    OperatorState,
    SubtaskStateHandle,
)
from statelog.errors import (
    ConfigError,
    CorruptionError,
    ObjectExistsError,
    SavepointNotFoundError,
    StoreError,
)
from statelog.layout import (
    check_savepoint_name,
    checkpoint_key,
    parse_savepoint_manifest_key,
    savepoint_data_prefix,
    savepoint_manifest_key,
    savepoint_metadata_key,
    savepoint_prefix,
)
from statelog.materialization.manifest import Manifest, load_manifest
from statelog.state_processor.progress import InProgress
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)


def savepoint_metadata(meta: CheckpointMetadata, manifest: Manifest, created_ms: int) -> CheckpointMetadata:
    """The metadata of a savepoint of ``meta`` whose image is ``manifest`` (as written: its
    handles record the manifest's size and CRC-32, and it carries the savepoint's name)."""
    operators = {}
    for uid, op in meta.operators.items():
        handles = tuple(
            SubtaskStateHandle(
                operator_uid=h.operator_uid,
                subtask=h.subtask,
                parallelism=h.parallelism,
                key_groups=h.key_groups,
                changelog=(),
                states=h.states,
                materialization=(manifest.reference(h.key_groups),),
            )
            for h in op.subtasks
        )
        operators[uid] = OperatorState(uid, op.parallelism, handles)
    return CheckpointMetadata(
        checkpoint_id=meta.checkpoint_id,
        job_id=meta.job_id,
        timestamp_ms=created_ms,
        max_parallelism=meta.max_parallelism,
        sources=dict(meta.sources),
        operators=operators,
        stats={
            "checkpoint_timestamp_ms": meta.timestamp_ms,
            "manifest": manifest.key,
            "rows": manifest.rows,
            "bytes": manifest.bytes,
            "files": sum(len(fs) for op in manifest.operators.values() for fs in op.files.values()),
        },
        kind="savepoint",
        savepoint=manifest.savepoint,
    )


def create_savepoint(
    store: ObjectStore,
    checkpoint_id: int | str,
    name: str,
    *,
    options: MaterializeOptions | None = None,
) -> CheckpointMetadata:
    """Write savepoint ``name`` of retained checkpoint ``checkpoint_id``; returns its metadata.

    Refuses a name that is taken (also by the leftovers of an unfinished creation). The
    checkpoint must stay retained while its image is written (GC may otherwise delete what
    it references; the creation then fails with an error naming the missing object).
    """
    name = check_savepoint_name(name)
    cid = parse_checkpoint_id(checkpoint_id)
    catalog = JobCatalog(store)
    job = catalog.open_job(None, create=False)
    meta_key, manifest_key = savepoint_metadata_key(name), savepoint_manifest_key(name)
    if store.exists(meta_key):
        existing = _describe(store, name)
        raise ConfigError(
            f"savepoint {name!r} already exists in {store.url}{existing}; choose another name, or delete "
            f"it first with `statelog savepoint delete ROOT {name}`"
        )
    leftovers = next(iter(store.list(savepoint_prefix(name))), None)
    if leftovers is not None:
        raise ConfigError(
            f"savepoint name {name!r} is in use in {store.url}: {leftovers.key} exists but the savepoint "
            "has no metadata (an unfinished or failed creation, or one still running); choose another "
            f"name, or remove the leftovers with `statelog savepoint delete ROOT {name}`"
        )
    meta = catalog.load(cid)  # a clear error listing the retained checkpoints if absent
    if meta.job_id != job.job_id:
        raise CorruptionError(
            f"checkpoint metadata {checkpoint_key(cid)} belongs to job {meta.job_id}, the root holds job "
            f"{job.job_id}; run `statelog verify ROOT`",
            key=checkpoint_key(cid),
        )
    t0 = time.monotonic()
    log.info("creating savepoint %r of checkpoint %d in %s", name, cid, store.url)
    # GC collects what an unpublished savepoint left once it aged past the grace period: the
    # marker, refreshed while this runs, keeps a long creation young
    marker = InProgress(store, name).start()
    try:
        manifest = Materializer(store, options).materialize(
            meta,
            data_prefix=savepoint_data_prefix(name),
            key=manifest_key,
            self_contained=True,
            kind="savepoint",
        )
        sp = savepoint_metadata(meta, manifest, int(time.time() * 1000))
        store.put(meta_key, sp.to_bytes())  # the savepoint exists from this moment
    except ObjectExistsError:
        marker.stop()
        raise ConfigError(
            f"savepoint {name!r} was created concurrently by another process in {store.url}; this "
            f"attempt left its files below {savepoint_data_prefix(name)} (they are not referenced); "
            "choose another name"
        ) from None
    except BaseException:
        marker.stop()  # what was written ages with it: GC collects it after the grace period
        raise
    marker.stop(delete=True)
    log.info(
        "savepoint %r of checkpoint %d created: %d rows in %d files, %d bytes, in %.2fs",
        name, cid, sp.stats["rows"], sp.stats["files"], sp.stats["bytes"], time.monotonic() - t0,
    )
    return sp


def _describe(store: ObjectStore, name: str) -> str:
    try:
        sp = load_savepoint(store, name)
    except (CorruptionError, StoreError, SavepointNotFoundError):
        return ""
    return f" (of checkpoint {sp.checkpoint_id})"


def savepoint_summary(store: ObjectStore, meta: CheckpointMetadata, name: str) -> dict[str, Any]:
    """The ``savepoint list`` record of one savepoint."""
    stats = meta.stats
    if not {"rows", "bytes", "files"} <= set(stats):  # not written by create_savepoint: ask the manifest
        parts = {p.manifest: p for op in meta.operators.values() for h in op.subtasks for p in h.materialization}
        manifests = [load_manifest(store, parts[k], job_id=meta.job_id) for k in sorted(parts)]
        stats = {
            "rows": sum(m.rows for m in manifests),
            "bytes": sum(m.bytes for m in manifests),
            "files": sum(len(fs) for m in manifests for op in m.operators.values() for fs in op.files.values()),
        }
    return {
        "name": name,
        "checkpoint_id": meta.checkpoint_id,
        "created_ms": meta.timestamp_ms,
        "created": _iso_utc(meta.timestamp_ms),
        "job_id": meta.job_id,
        "max_parallelism": meta.max_parallelism,
        "operators": {uid: op.parallelism for uid, op in sorted(meta.operators.items())},
        "sources": meta.sources,
        "rows": int(stats["rows"]),
        "bytes": int(stats["bytes"]),
        "files": int(stats["files"]),
        "metadata_key": savepoint_metadata_key(name),
    }


def list_savepoints(store: ObjectStore) -> list[dict[str, Any]]:
    """Every savepoint (those whose metadata exists), by name; an unreadable one has ``error``."""
    out = []
    for name in savepoint_names(store):
        try:
            out.append(savepoint_summary(store, load_savepoint(store, name), name))
        except SavepointNotFoundError:
            log.info("savepoint %r was deleted while listing", name)
        except (CorruptionError, StoreError) as e:
            out.append({"name": name, "metadata_key": savepoint_metadata_key(name), "error": str(e)})
    return out


def delete_savepoint(store: ObjectStore, name: str, *, force: bool = False) -> dict[str, Any]:
    """Delete savepoint ``name``: its metadata first (it no longer exists), then its files.

    Also removes the leftovers of an unfinished creation. Refuses (unless ``force``) while a
    retained checkpoint or the newest materialization builds on the savepoint's files.
    """
    name = check_savepoint_name(name)
    JobCatalog(store).open_job(None, create=False)
    prefix = savepoint_prefix(name)
    objects = list(store.list(prefix))
    if not objects:
        raise SavepointNotFoundError(
            f"savepoint {name!r} does not exist in {store.url} (savepoints: "
            f"{', '.join(savepoint_names(store)) or 'none'}); list them with `statelog savepoint list ROOT`"
        )
    meta_key = savepoint_metadata_key(name)
    had_metadata = any(o.key == meta_key for o in objects)
    if not force:
        users = savepoint_users(store, name)
        if users:
            raise ConfigError(
                f"savepoint {name!r} is still needed: {users} build on its files (a job restored from it "
                "references its image until it adopts a newer materialization); deleting it would make "
                "them unrestorable. Delete it once they are no longer retained and a newer "
                "materialization exists, or pass --force"
            )
    if had_metadata:
        store.delete(meta_key)
        log.info("savepoint %r: deleted its metadata %s", name, meta_key)
        if not force:  # a checkpoint published meanwhile may build on it: then keep the files
            users = savepoint_users(store, name)
            if users:
                raise ConfigError(
                    f"savepoint {name!r}: its metadata was deleted, but {users} published meanwhile build "
                    f"on its files, so they were kept below {prefix}; delete it again once those are "
                    "no longer retained"
                )
    rest = sorted((o for o in objects if o.key != meta_key), key=lambda o: (parse_savepoint_manifest_key(o.key) is None, o.key))
    for o in rest:  # the manifest before the files it lists
        store.delete(o.key)
    result = {
        "name": name,
        "had_metadata": had_metadata,
        "objects_deleted": len(objects),
        "bytes_deleted": sum(o.size for o in objects),
    }
    log.info("savepoint %r deleted: %d object(s), %d bytes", name, result["objects_deleted"],
             result["bytes_deleted"])
    return result


def savepoint_users(store: ObjectStore, name: str) -> str:
    """What needs the savepoint's files besides the savepoint itself, in words ("" if nothing).

    A job restored from a savepoint builds its checkpoints on the savepoint's manifest until
    it adopts a newer materialization, and an incremental materialization of such a
    checkpoint reuses the savepoint's table files by path. A checkpoint whose metadata (or
    manifest) cannot be read counts as a user: what it references is unknown.
    """
    prefix = savepoint_prefix(name)
    catalog = JobCatalog(store)
    cache: dict[str, Manifest] = {}
    cids, unreadable = [], []
    for cid in catalog.checkpoint_ids():
        live = LiveSet(cache=cache)
        live.add_checkpoint(catalog, cid)
        if live.errors:
            unreadable.append(cid)
        elif any(k.startswith(prefix) for k in live.keys):
            cids.append(cid)
    what = [f"retained checkpoint(s) {', '.join(map(str, cids))}"] if cids else []
    if unreadable:
        what.append(f"possibly checkpoint(s) {', '.join(map(str, unreadable))} (unreadable metadata or manifest)")
    newest, _ = recent_manifests(store, float("inf"))
    if newest is not None:
        live = LiveSet(cache=cache)
        live.add_manifest(store, newest, "the newest materialization")
        if live.errors or any(k.startswith(prefix) for k in live.keys):
            what.append(f"the newest materialization {newest}")
    return " and ".join(what)


def _iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"
