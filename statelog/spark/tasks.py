"""Running a list of independent Python tasks as one Spark job (the restore job, materialization).

:func:`run_tasks` maps a picklable function over the tasks, one Spark task each, in a job
group of its own, and reports progress from the driver while the job runs. A progress hook
that raises (a stop request, a lost lease) or a ``KeyboardInterrupt`` cancels the job group
and waits for the job to end before the exception goes on, so no task of it still writes
when the caller continues. Store options travel inside the pickled function (a
:class:`~statelog.store.options.StoreOptions`, whose renderings hide secrets), never in the
Spark configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from statelog.errors import StatelogError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")
Progress = Callable[[int, int], None]  # (tasks done, tasks)


def first_line(e: BaseException) -> str:
    """The line of a Spark error that carries our message (a Python worker's statelog error)."""
    text = str(e)
    for line in text.splitlines():
        if "Error:" in line and "statelog" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(e).__name__


def run_tasks(
    spark: SparkSession,
    fn: Callable[[T], Any],
    tasks: Sequence[T],
    group: str,
    what: str,
    progress: Progress | None = None,
) -> list[Any]:
    """``[fn(t) for t in tasks]`` as one Spark job (one task each), in ``tasks``' order.

    ``group`` names the job group, ``what`` the job in its description and errors; a failure
    inside Spark is a :class:`StatelogError` ``"<what> failed in Spark: <first line>"``."""
    from pyspark import InheritableThread

    sc = spark.sparkContext
    indexed = list(enumerate(tasks))
    rdd = sc.parallelize(indexed, max(1, len(indexed))).map(lambda it: (it[0], fn(it[1])))
    out: dict[str, Any] = {}

    def work() -> None:
        try:
            sc.setJobGroup(group, what, interruptOnCancel=True)
            out["results"] = rdd.collect()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = e

    thread = InheritableThread(target=work, daemon=True)
    thread.start()
    tracker = sc.statusTracker()
    try:
        while thread.is_alive():
            thread.join(0.25)
            if progress is not None:
                done = 0
                for jid in tracker.getJobIdsForGroup(group):
                    info = tracker.getJobInfo(jid)
                    for sid in info.stageIds if info is not None else ():
                        st = tracker.getStageInfo(sid)
                        done += st.numCompletedTasks if st is not None else 0
                progress(min(done, len(tasks)), len(tasks))
    except BaseException:
        sc.cancelJobGroup(group)
        thread.join()
        raise
    if "error" in out:
        raise StatelogError(f"{what} failed in Spark: {first_line(out['error'])}") from out["error"]
    if progress is not None:
        progress(len(tasks), len(tasks))
    return [r for _, r in sorted(out["results"], key=lambda ir: ir[0])]
