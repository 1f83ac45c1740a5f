"""Restore and rescale: a Spark job that writes a checkpoint's state as a savepoint laid out
for a new parallelism (``statelog restore ROOT --checkpoint ID --parallelism P``).

For every operator (minus dropped ones, under its new uid if renamed) and every new subtask
``i`` of ``P``, one Spark task restores key groups ``key_group_range_for_subtask(M, P, i)``
of the checkpoint (the overlapping materialized parts and changelog ranges of the old
handles, restricted to those key groups, exactly what a runtime restore reads) and writes
them as Parquet state tables with the engine's table writer
(:class:`statelog.materialization.table_writer.StateTableWriter`, as a materialization), self-contained
below ``savepoints/<name>/data/``. Files are cut at unit boundaries inside the new subtask's
range, so each new subtask reads only its own files. The driver then writes one manifest
(``savepoints/<name>/manifest.json``, kind ``savepoint``) and, last, the savepoint metadata
(``savepoints/<name>/_metadata.json``, kind ``savepoint``) with one handle per new subtask::

    SubtaskStateHandle(uid, subtask=i, parallelism=P, key_groups=R_i, changelog=(),
                       materialization=(MaterializedPart(manifest key, R_i),))

A job then restores subtask ``i`` with ``job.backend(uid, subtask=i, parallelism=P,
restore="savepoint:NAME")`` and resumes from the checkpoint's source positions (kept in the
savepoint metadata). ``max_parallelism`` is preserved; GC never deletes savepoints.

Before any task runs, :func:`prepare` checks that the savepoint can be written
(:func:`check_writable`: a small probe object below ``savepoints/<name>/``, written and
deleted again), so credentials that may not write fail in about a second, not at the first
write of a Spark task.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from statelog.checkpoint.metadata import (
    CheckpointMetadata,
    MaterializedPart,
    OperatorState,
    SubtaskStateHandle,
)
from statelog.descriptors import StateInfo
from statelog.errors import ConfigError, StatelogError, StoreError, StorePermissionError
from statelog.job import StateJob
from statelog.keys.groups import KeyGroupRange, key_group_range_for_subtask
from statelog.layout import (
    check_savepoint_name,
    new_materialization_id,
    savepoint_data_prefix,
    savepoint_manifest_key,
    savepoint_metadata_key,
    savepoint_prefix,
    table_dir,
)
from statelog.materialization.manifest import Manifest, MaterializedOperator, TableFile
from statelog.materialization.table_writer import StateTableWriter, new_stats
from statelog.spark import options as opt
from statelog.spark.tasks import run_tasks
from statelog.store import open_store
from statelog.store.options import StoreOptions, resolve_store_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (tasks done, tasks)


# -- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestoreTask:
    """Restore key groups of new subtask ``subtask`` of ``parallelism`` of operator ``uid``."""

    number: int
    uid: str  # in the source checkpoint
    new_uid: str
    subtask: int
    parallelism: int
    handle: dict[str, Any]  # SubtaskStateHandle JSON (old uid, the new subtask's key groups)
    checkpoint_id: int
    job_id: str
    max_parallelism: int


def merged_handle(op: OperatorState, kgr: KeyGroupRange, subtask: int, parallelism: int) -> SubtaskStateHandle:
    """One handle with everything a restore of ``kgr`` reads from ``op``'s handles.

    The old handles have disjoint key groups, so their parts and ranges restricted to
    ``kgr`` can be listed one handle after another (each key group's records stay in order).
    """
    parts: list[MaterializedPart] = []
    ranges = []
    states: dict[str, StateInfo] = {}
    for h in sorted(op.handles_for(kgr), key=lambda h: h.key_groups.start):
        inter = h.key_groups.intersect(kgr)
        for info in h.states:
            states.setdefault(info.name, info)
        for p in h.materialization:
            sub = p.restrict(inter)
            if sub is not None:
                parts.append(sub)
        for r in h.changelog:
            sub_r = r.restrict(inter)
            if sub_r is not None:
                ranges.append(sub_r)
    for info in op.states.values():
        states.setdefault(info.name, info)
    return SubtaskStateHandle(
        operator_uid=op.uid, subtask=subtask, parallelism=parallelism, key_groups=kgr,
        changelog=tuple(ranges), states=tuple(states.values()), materialization=tuple(parts),
    )


def parse_renames(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise ConfigError(f"--rename-operator {item!r} is not of the form OLD=NEW")
        if old in out:
            raise ConfigError(f"--rename-operator renames {old!r} twice")
        out[old] = new
    return out


def plan_restore(
    meta: CheckpointMetadata,
    parallelism: int | None,
    drop: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
    where: str = "",
) -> list[RestoreTask]:
    maxp = meta.max_parallelism
    where = where or opt.describe(meta)
    rename = dict(rename or {})
    if parallelism is not None and (type(parallelism) is not int or not 1 <= parallelism <= maxp):
        raise ConfigError(
            f"parallelism {parallelism!r} is outside 1..{maxp}: a job can run at most max_parallelism "
            f"({maxp}) subtasks, one per key group (max_parallelism is fixed for the life of the job)"
        )
    for uid in [*drop, *rename]:
        opt.operator_of(meta, uid, where)
    both = set(drop) & set(rename)
    if both:
        raise ConfigError(f"operator(s) {sorted(both)} are both dropped and renamed; do one or the other")
    kept = [uid for uid in sorted(meta.operators) if uid not in set(drop)]
    if not kept:
        raise ConfigError(f"every operator of {where} would be dropped: nothing to restore")
    new_uids = [rename.get(uid, uid) for uid in kept]
    for uid in new_uids:
        if not isinstance(uid, str) or not uid.strip():
            raise ConfigError("an operator uid must be a non-empty string")
    dup = sorted({u for u in new_uids if new_uids.count(u) > 1})
    if dup:
        raise ConfigError(f"after renaming, operator uid(s) {dup} would be used twice; pick unique uids")
    tasks = []
    for uid in kept:
        op = meta.operators[uid]
        p = parallelism if parallelism is not None else op.parallelism
        for i in range(p):
            kgr = key_group_range_for_subtask(maxp, p, i)
            h = merged_handle(op, kgr, i, p)
            tasks.append(RestoreTask(len(tasks), uid, rename.get(uid, uid), i, p, h.to_json(),
                                     meta.checkpoint_id, meta.job_id, maxp))
    return tasks


# -- one task (runs in a Spark Python worker) ----------------------------------------------------


def run_task(root: str, store_options: Mapping[str, Any] | None, name: str, task: RestoreTask) -> dict[str, Any]:
    """Write the state tables of one new subtask; returns the tables (or an error message)."""
    t0 = time.monotonic()
    try:
        store = open_store(root, dict(store_options or {}) or None)
    except StatelogError as e:
        return {"number": task.number, "error": f"{type(e).__name__}: {e}"}
    try:
        handle = SubtaskStateHandle.from_json(task.handle)
        meta = CheckpointMetadata(
            checkpoint_id=task.checkpoint_id, job_id=task.job_id, timestamp_ms=0,
            max_parallelism=task.max_parallelism, sources={},
            operators={task.uid: OperatorState(task.uid, task.parallelism, (handle,))},
        )
        mid = new_materialization_id(task.checkpoint_id, 0)
        stats = new_stats()
        with StateTableWriter(store) as writer:
            mop = writer.write_operator(meta, task.uid, 0, table_dir(mid, savepoint_data_prefix(name)), True, stats)
        stats["duration_ms"] = round((time.monotonic() - t0) * 1000, 1)
        return {"number": task.number, "operator": mop.to_json(), "stats": stats,
                "seconds": round(time.monotonic() - t0, 3)}
    except StatelogError as e:
        return {"number": task.number, "error": f"{type(e).__name__}: {e}"}
    finally:
        store.close()


# -- the job -------------------------------------------------------------------------------------


@dataclass
class RestoreResult:
    savepoint: str
    checkpoint_id: int
    source: str
    max_parallelism: int
    operators: dict[str, dict[str, Any]]
    dropped: list[str]
    rows: int
    files: int
    bytes: int
    seconds: float
    tasks: int
    metadata_key: str
    manifest_key: str
    sources: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "savepoint": self.savepoint,
            "restore": f"savepoint:{self.savepoint}",
            "checkpoint_id": self.checkpoint_id,
            "source": self.source,
            "max_parallelism": self.max_parallelism,
            "operators": self.operators,
            "dropped": self.dropped,
            "rows": self.rows,
            "files": self.files,
            "bytes": self.bytes,
            "tasks": self.tasks,
            "seconds": self.seconds,
            "metadata_key": self.metadata_key,
            "manifest_key": self.manifest_key,
            "sources": self.sources,
        }


def default_name(meta: CheckpointMetadata, parallelism: int | None) -> str:
    stamp = datetime.now(tz=UTC).strftime("%Y%m%dT%H%M%S")
    p = f"-p{parallelism}" if parallelism is not None else ""
    return f"restore-{meta.checkpoint_id}{p}-{stamp}"


def _check_name_free(job: StateJob, name: str) -> None:
    if job.store.exists(savepoint_metadata_key(name)):
        raise ConfigError(
            f"savepoint {name!r} already exists in {job.root}; choose another --savepoint name or delete it "
            f"with `statelog savepoint delete ROOT {name}`"
        )
    leftover = next(iter(job.store.list(savepoint_prefix(name))), None)
    if leftover is not None:
        raise ConfigError(
            f"savepoint name {name!r} is in use in {job.root}: {leftover.key} exists without savepoint "
            "metadata (an unfinished or failed creation); choose another name or remove the leftovers with "
            f"`statelog savepoint delete ROOT {name}`"
        )


WRITE_CHECK_NAME = "write-check-"  # the probe object: savepoints/<name>/write-check-<random hex>
_WRITE_CHECK_DATA = b"statelog restore: write check, deleted right after it was written\n"


def check_writable(job: StateJob, name: str) -> None:
    """Check that savepoint ``name`` can be written before the restore job starts.

    Writes a small probe object ``savepoints/<name>/write-check-<random hex>`` (a conditional
    create, so nothing is overwritten) and deletes it again. Without write permission this
    raises :class:`StorePermissionError` naming the object and the permission. The restore
    needs no delete permission: a probe that cannot be deleted is logged as a warning naming
    it and the missing permission; it stays below the savepoint's prefix and goes with
    ``statelog savepoint delete ROOT NAME``.
    """
    key = f"{savepoint_prefix(name)}{WRITE_CHECK_NAME}{uuid.uuid4().hex}"
    try:
        created = job.store.put_if_absent(key, _WRITE_CHECK_DATA)
    except StorePermissionError as e:
        raise StorePermissionError(
            f"cannot write savepoint {name!r} in {job.root} (checked before the restore job starts, "
            f"by writing {key}): {e}", key=key,
        ) from None
    if not created:  # a random name: only a store that ignores conditional creates gets here
        raise StoreError(
            f"the write check of savepoint {name!r} found {key} in {job.root} already present; "
            "run the restore again", key=key,
        )
    try:
        job.store.delete(key)
    except StorePermissionError as e:
        log.warning(
            "the write check object %s was written but cannot be deleted: %s. The restore needs no delete "
            "permission and goes on; the object stays below %s and is removed with the savepoint "
            "(`statelog savepoint delete ROOT %s`)", key, e, savepoint_prefix(name), name,
        )


@dataclass(frozen=True)
class RestorePlan:
    meta: CheckpointMetadata
    where: str
    name: str
    tasks: list[RestoreTask]
    dropped: list[str]


def prepare(
    job: StateJob,
    checkpoint: str | int,
    *,
    parallelism: int | None = None,
    savepoint: str | None = None,
    drop: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
) -> RestorePlan:
    """Check the arguments and that the savepoint can be written (:func:`check_writable`), and plan the
    tasks (no Spark needed: the CLI runs it before starting Spark)."""
    which = str(checkpoint)
    meta = opt.resolve(job, which)
    sp_source = which.strip()[len("savepoint:"):] if which.strip().startswith("savepoint:") else None
    where = opt.describe(meta, sp_source)
    tasks = plan_restore(meta, parallelism, drop, rename, where)
    name = check_savepoint_name(savepoint) if savepoint is not None else default_name(meta, parallelism)
    _check_name_free(job, name)
    check_writable(job, name)
    return RestorePlan(meta, where, name, tasks, sorted(set(drop)))


def restore(
    spark: SparkSession,
    root: str,
    checkpoint: str | int,
    *,
    parallelism: int | None = None,
    savepoint: str | None = None,
    drop: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
    store_options: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    plan: RestorePlan | None = None,
) -> RestoreResult:
    """Run the restore job; returns what it wrote (the savepoint exists when this returns).

    ``plan`` is what :func:`prepare` returned for the same arguments (the CLI prepares, and so
    checks, before it starts Spark); without it the plan is prepared here.
    """
    t0 = time.monotonic()
    job = StateJob(root, store_options=dict(store_options or {}) or None, create=False)
    try:
        if plan is None:
            plan = prepare(job, checkpoint, parallelism=parallelism, savepoint=savepoint, drop=drop, rename=rename)
        log.info("restore job: %s -> savepoint %r, %d task(s)", plan.where, plan.name, len(plan.tasks))
        # resolved here, with the driver's AWS_* environment: the executors may lack it
        resolved = resolve_store_options(job.root, store_options)
        results = _run(spark, job.root, resolved, plan.name, plan.tasks, progress)
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise StatelogError(
                f"the restore job failed ({len(errors)} of {len(plan.tasks)} task(s)); first error: {errors[0]}. "
                f"Files written below {savepoint_prefix(plan.name)} are not referenced; remove them with "
                f"`statelog savepoint delete ROOT {plan.name}`"
            )
        return _publish(job, plan.meta, plan.where, plan.name, plan.tasks, results, plan.dropped, t0)
    finally:
        job.close()


def _run(spark: SparkSession, root: str, store_options: Mapping[str, Any] | None, name: str,
         tasks: list[RestoreTask], progress: Progress | None) -> list[dict[str, Any]]:
    fn = partial(run_task, root, StoreOptions(store_options), name)
    return run_tasks(spark, fn, tasks, f"statelog-restore-{name}", "the restore job", progress)


def _publish(job: StateJob, meta: CheckpointMetadata, where: str, name: str, tasks: list[RestoreTask],
             results: list[dict[str, Any]], dropped: list[str], t0: float) -> RestoreResult:
    maxp = meta.max_parallelism
    files: dict[str, dict[str, list[TableFile]]] = {}
    states: dict[str, dict[str, StateInfo]] = {}
    covered: dict[str, dict[str, int]] = {}
    stats = {"rows": 0, "files_written": 0, "bytes_written": 0, "changelog_records": 0, "changelog_bytes": 0,
             "base_rows_read": 0}
    parallelism: dict[str, int] = {}
    source_uid: dict[str, str] = {}
    for task, res in zip(tasks, results, strict=True):
        mop = MaterializedOperator.from_json(task.new_uid, res["operator"])
        parallelism[task.new_uid] = task.parallelism
        source_uid[task.new_uid] = task.uid
        for info in mop.states:
            states.setdefault(task.new_uid, {}).setdefault(info.name, info)
        for s, end in mop.covered.items():
            cov = covered.setdefault(task.new_uid, {})
            cov[s] = max(cov.get(s, 0), end)
        for state, fs in mop.files.items():
            files.setdefault(task.new_uid, {}).setdefault(state, []).extend(fs)
        for k in stats:
            stats[k] += int(res["stats"].get(k, 0))
    operators = {}
    for uid in parallelism:
        operators[uid] = MaterializedOperator(
            uid=uid,
            states=tuple(states.get(uid, {})[n] for n in sorted(states.get(uid, {}))),
            covered=covered.get(uid, {}),
            files={n: tuple(sorted(fs, key=lambda f: f.key_groups.start)) for n, fs in files.get(uid, {}).items()},
        )
    stats["duration_ms"] = round((time.monotonic() - t0) * 1000, 1)
    mkey = savepoint_manifest_key(name)
    manifest = Manifest(
        mid=new_materialization_id(meta.checkpoint_id, 0), key=mkey, checkpoint_id=meta.checkpoint_id,
        job_id=meta.job_id, max_parallelism=maxp, created_ms=int(time.time() * 1000), lease_generation=0,
        operators=operators, kind="savepoint", stats=stats, savepoint=name,
    )
    data, manifest = manifest.stored()
    job.store.put(mkey, data)
    handles = {}
    for uid, p in parallelism.items():
        old = meta.operators[source_uid[uid]]
        infos = tuple(old.states.values())
        handles[uid] = OperatorState(uid, p, tuple(
            SubtaskStateHandle(
                operator_uid=uid, subtask=i, parallelism=p, key_groups=key_group_range_for_subtask(maxp, p, i),
                changelog=(), states=infos,
                materialization=(manifest.reference(key_group_range_for_subtask(maxp, p, i)),),
            )
            for i in range(p)
        ))
    nfiles = sum(len(fs) for op in operators.values() for fs in op.files.values())
    renamed = {uid: source_uid[uid] for uid in parallelism if source_uid[uid] != uid}
    sp = CheckpointMetadata(
        checkpoint_id=meta.checkpoint_id, job_id=meta.job_id, timestamp_ms=int(time.time() * 1000),
        max_parallelism=maxp, sources=dict(meta.sources), operators=handles, kind="savepoint", savepoint=name,
        stats={
            "checkpoint_timestamp_ms": meta.timestamp_ms, "manifest": mkey, "rows": manifest.rows,
            "bytes": manifest.bytes, "files": nfiles, "restored_from": where,
            "parallelism": dict(parallelism), "dropped_operators": dropped, "renamed_operators": renamed,
        },
    )
    job.store.put(savepoint_metadata_key(name), sp.to_bytes())  # the savepoint exists from here
    seconds = round(time.monotonic() - t0, 3)
    log.info("restore job wrote savepoint %r: %d rows in %d files (%d bytes) in %.2fs",
             name, manifest.rows, nfiles, manifest.bytes, seconds)
    return RestoreResult(
        savepoint=name, checkpoint_id=meta.checkpoint_id, source=where, max_parallelism=maxp,
        operators={
            uid: {"from": source_uid[uid], "parallelism": p, "rows": operators[uid].rows,
                  "files": sum(len(fs) for fs in operators[uid].files.values()), "bytes": operators[uid].bytes}
            for uid, p in sorted(parallelism.items())
        },
        dropped=dropped, rows=manifest.rows, files=nfiles, bytes=manifest.bytes, seconds=seconds,
        tasks=len(tasks), metadata_key=savepoint_metadata_key(name), manifest_key=mkey,
        sources=json.loads(json.dumps(meta.sources, default=str)),
    )
