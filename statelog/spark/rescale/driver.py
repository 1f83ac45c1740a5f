"""The restore job's driver: :func:`prepare` (checks and plan, before Spark starts) and
:func:`restore` (the tasks as one Spark job, then the savepoint published)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import StatelogError
from statelog.job import StateJob
from statelog.layout import check_savepoint_name, savepoint_prefix
from statelog.readers import options as opt
from statelog.spark.rescale.checks import check_name_free, check_writable, default_name
from statelog.spark.rescale.plan import RestoreTask, plan_restore
from statelog.spark.rescale.publish import RestoreResult, publish_savepoint
from statelog.spark.rescale.write import run_task
from statelog.spark.tasks import run_tasks
from statelog.state_processor.progress import InProgress
from statelog.store.local_copies import local_copies_setting
from statelog.store.options import StoreOptions, resolve_store_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (tasks done, tasks)


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
    check_name_free(job, name)
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
    local_copies: bool | str | Mapping[str, Any] | None = None,
) -> RestoreResult:
    """Run the restore job; returns what it wrote (the savepoint exists when this returns).

    ``local_copies`` (``statelog.open``'s setting, off by default): each task reads the old
    state from the local copies on its executor's host first (a directory the executors of a
    host share, e.g. ``$STATELOG_LOCAL_COPIES_DIR`` set by ``spark.executorEnv``).

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
        # GC collects what an unpublished savepoint left once it aged past the grace period: the
        # marker, refreshed while the tasks run, keeps a long restore job's files young
        marker = InProgress(job.store, plan.name).start()
        try:
            published = _run_and_publish(spark, job, plan, resolved, progress, local_copies, t0)
        except BaseException:
            marker.stop()
            raise
        marker.stop(delete=True)
        return published
    finally:
        job.close()


def _run_and_publish(spark: SparkSession, job: StateJob, plan: RestorePlan, resolved: Mapping[str, Any] | None,
                     progress: Progress | None, local_copies: bool | str | Mapping[str, Any] | None,
                     t0: float) -> RestoreResult:
    results = _run(spark, job.root, resolved, plan.name, plan.tasks, progress,
                   local_copies_setting(local_copies))  # checked here, the directory resolved per host
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise StatelogError(
            f"the restore job failed ({len(errors)} of {len(plan.tasks)} task(s)); first error: {errors[0]}. "
            f"Files written below {savepoint_prefix(plan.name)} are not referenced; GC removes them after its "
            f"grace period, or now: `statelog savepoint delete ROOT {plan.name}`"
        )
    return publish_savepoint(job, plan.meta, plan.where, plan.name, plan.tasks, results, plan.dropped, t0)


def _run(spark: SparkSession, root: str, store_options: Mapping[str, Any] | None, name: str,
         tasks: list[RestoreTask], progress: Progress | None,
         local_copies: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    fn = partial(run_task, root, StoreOptions(store_options), name, local_copies=local_copies)
    return run_tasks(spark, fn, tasks, f"statelog-restore-{name}", "the restore job", progress)
