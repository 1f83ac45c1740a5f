"""Materialization as a Spark job (``statelog materializer run ROOT --engine spark``).

:class:`SparkEngine` is a :class:`~materializer.build.TableEngine`: the driver plans each
operator exactly as the in-process writer does
(:func:`statelog.materialization.table_writer.plan_operator`: per subtask handle its bases and
states), cuts every handle's key groups into units (:func:`~statelog.materialization.table_writer.split_units`,
``MaterializeOptions.units`` per operator; units that share a base file stay together) and
runs one Spark task per unit (:func:`run_unit`): it reads the unit's base files and
changelog records, writes its Parquet files and returns their descriptors and counters. The
driver assembles the operators of the manifest from them;
:class:`~materializer.build.Materializer` then publishes it exactly as in process (after
the daemon's fencing check, under its lease generation). The tables are those of the
in-process writer: same key-group ranges, same rows (tests/materializer/test_spark_materialize.py).

Store options reach the executors the documented way (docs/spark.md): resolved on the
driver with its ``AWS_*`` environment into explicit
:class:`~statelog.store.options.StoreOptions` that travel inside the pickled task function,
never in the Spark configuration or a log line (their renderings hide secrets). PySpark is
imported only when the engine starts a session: without the ``spark`` extra that is a
:class:`~statelog.errors.MissingDependencyError` naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from materializer.build import MaterializeOptions, Progress
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError, StatelogError
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest, MaterializedOperator, TableFile
from statelog.materialization.table_writer import (
    StateTableWriter,
    UnitWork,
    new_stats,
    plan_operator,
    split_units,
)
from statelog.store import open_store
from statelog.store.base import ObjectStore
from statelog.store.options import StoreOptions, resolve_store_options

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitTask:
    """One Spark task: write the tables of ``work`` below ``dir_``."""

    work: UnitWork
    unit: int  # key groups per unit of the operator
    dir_: str
    self_contained: bool
    options: MaterializeOptions


def run_unit(root: str, store_options: Mapping[str, Any], task: UnitTask) -> dict[str, Any]:
    """Write one unit's tables (runs in a Spark Python worker); its files and counters, or
    an error line."""
    t0 = time.monotonic()
    try:
        store = open_store(root, dict(store_options) or None)
    except StatelogError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        stats = new_stats()
        with StateTableWriter(store, task.options) as writer:
            files = writer.write_unit(task.work, task.unit, task.dir_, task.self_contained, stats)
        return {"files": {n: [f.to_json() for f in fs] for n, fs in files.items()}, "stats": stats,
                "seconds": round(time.monotonic() - t0, 3)}
    except StatelogError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        store.close()


def group_units(pieces: list[UnitWork], groups: int) -> list[UnitWork]:
    """Consecutive ``pieces`` of one handle merged into at most ``groups`` works of about
    equal key-group counts (a cut between pieces is a cut the tables allow)."""
    if len(pieces) <= groups:
        return pieces
    total = sum(len(p.key_groups) for p in pieces)
    out: list[UnitWork] = []
    current: list[UnitWork] = []
    done = 0

    def close() -> None:
        first, last = current[0], current[-1]
        out.append(replace(first, key_groups=KeyGroupRange(first.key_groups.start, last.key_groups.end)))
        current.clear()

    for p in pieces:
        n, ideal = len(p.key_groups), total * (len(out) + 1) / groups
        if current and len(out) < groups - 1 and (done >= ideal or done + n - ideal > ideal - done):
            close()  # the boundary is nearer before this piece than after it
        current.append(p)
        done += n
    close()
    return out


class SparkEngine:
    """Writes a materialization's tables as Spark tasks (see the module docstring).

    ``root`` and ``store_options``: the job root as the executors open it (the options are
    resolved here, with this process's environment). ``tasks``: about how many Spark tasks a
    materialization runs (default: the session's ``defaultParallelism``, its cores): every
    handle gets its share, as consecutive units, at least one unit per task. Each task
    reads the blocks of its handle's changelog that hold its key groups, and a block
    usually holds all the handle's key groups: more tasks than cores would decode the same
    blocks more often for no gain. ``spark``: a SparkSession to use;
    without one, the active session of this process is used, or else one is started at the
    first materialization with ``master`` (default ``$STATELOG_SPARK_MASTER`` or
    ``local[*]``) and stopped by :meth:`close`.
    """

    def __init__(self, root: str, store_options: Mapping[str, Any] | None = None, *, spark: Any = None,
                 master: str | None = None, tasks: int | None = None) -> None:
        if tasks is not None and (type(tasks) is not int or tasks < 1):
            raise ConfigError(f"tasks must be a whole number >= 1 (Spark tasks per materialization), got {tasks!r}")
        if spark is None:  # fail now, not at the first materialization, without the spark extra
            import statelog.spark  # noqa: F401 - the MissingDependencyError naming the extra
        self.root = root
        self.tasks = tasks
        self.store_options = resolve_store_options(root, store_options)
        self.master = master
        self._spark = spark
        self._owns_session = False
        self.last_tasks = 0

    def __repr__(self) -> str:
        return f"SparkEngine({self.root!r}, master={self.master!r})"

    def session(self) -> Any:
        if self._spark is None:
            import statelog.spark  # without PySpark: the MissingDependencyError naming the extra

            active = statelog.spark.SparkSession.getActiveSession()
            if active is not None:  # this process's session (e.g. a notebook's): used, never stopped
                self._spark = active
            else:
                self._spark = statelog.spark.session(self.master, app_name="statelog-materializer")
                self._owns_session = True
        return self._spark

    def close(self) -> None:
        if self._owns_session and self._spark is not None:
            self._spark.stop()
            self._spark = None
            self._owns_session = False

    def write_tables(
        self,
        store: ObjectStore,
        meta: CheckpointMetadata,
        dir_: str,
        self_contained: bool,
        stats: dict[str, Any],
        options: MaterializeOptions,
        progress: Progress | None,
        manifests: dict[str, Manifest],
    ) -> dict[str, MaterializedOperator]:
        plans = [plan_operator(store, meta, uid, idx, options, manifests)
                 for idx, uid in enumerate(sorted(meta.operators))]
        works = [(plan, work) for plan in plans for work in plan.works]
        target = self.tasks or (int(self.session().sparkContext.defaultParallelism) if works else 1)
        per_handle = max(1, -(-target // max(1, len(works))))
        tasks = [UnitTask(piece, plan.unit, dir_, self_contained, options)
                 for plan, work in works for piece in group_units(split_units(work, plan.unit), per_handle)]
        files: dict[str, dict[str, list[TableFile]]] = {plan.uid: {} for plan in plans}
        if tasks:
            from statelog.spark.tasks import run_tasks

            def report(done: int, total: int) -> None:
                if progress is not None:
                    progress(f"Spark tasks {done}/{total}", done, total)

            fn = partial(run_unit, self.root, StoreOptions(self.store_options))
            log.info("materializing checkpoint %d as %d Spark task(s)", meta.checkpoint_id, len(tasks))
            results = run_tasks(self.session(), fn, tasks, f"statelog-materialize-{dir_}",
                                f"the materialization of checkpoint {meta.checkpoint_id}", report)
            errors = [r["error"] for r in results if "error" in r]
            if errors:
                raise StatelogError(
                    f"the materialization of checkpoint {meta.checkpoint_id} failed in {len(errors)} of "
                    f"{len(tasks)} Spark task(s); first error: {errors[0]}. Nothing was published; the "
                    "files written are unreferenced and GC removes them after its grace period"
                )
            for task, res in zip(tasks, results, strict=True):
                out = files[task.work.uid]
                for name, fs in res["files"].items():
                    out.setdefault(name, []).extend(TableFile.from_json(f) for f in fs)
                for k, v in res["stats"].items():
                    stats[k] += v
        self.last_tasks = len(tasks)
        return {plan.uid: plan.result(files[plan.uid]) for plan in plans}
