"""Materialization as a Spark job (``statelog materializer run ROOT --engine spark``).

:class:`SparkEngine` is a :class:`~materializer.build.TableEngine`: the driver plans each
operator exactly as the in-process writer does
(:func:`statelog.materialization_writer.plan_operator`: per subtask handle its bases and
states), cuts every handle's key groups into units (:func:`~statelog.materialization_writer.split_units`,
``MaterializeOptions.units`` per operator; units that share a base file stay together) and
runs one Spark task per unit (:func:`run_unit`): it reads the unit's base files and
changelog records, writes its Parquet files and returns their descriptors and counters. The
driver assembles the operators of the manifest from them;
:class:`~materializer.build.Materializer` then publishes it exactly as in process (after
the daemon's fencing check, under its lease generation). The tables are those of the
in-process writer: same key-group ranges, same rows (tests/spark/test_materialize.py).

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
from dataclasses import dataclass
from functools import partial
from typing import Any

from materializer.build import MaterializeOptions, Progress
from statelog.checkpoint import CheckpointMetadata
from statelog.errors import StatelogError
from statelog.materialization import Manifest, MaterializedOperator, TableFile
from statelog.materialization_writer import (
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


class SparkEngine:
    """Writes a materialization's tables as Spark tasks (see the module docstring).

    ``root`` and ``store_options``: the job root as the executors open it (the options are
    resolved here, with this process's environment). ``spark``: a SparkSession to use;
    without one, a session is started at the first materialization with ``master``
    (default ``$STATELOG_SPARK_MASTER`` or ``local[*]``) and stopped by :meth:`close`.
    """

    def __init__(self, root: str, store_options: Mapping[str, Any] | None = None, *, spark: Any = None,
                 master: str | None = None) -> None:
        self.root = root
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
        tasks = [UnitTask(piece, plan.unit, dir_, self_contained, options)
                 for plan in plans for work in plan.works for piece in split_units(work, plan.unit)]
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
