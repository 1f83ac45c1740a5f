"""One task of the restore job, run in a Spark Python worker: the state tables of one new subtask.

The task opens its own store, restores the key groups of its merged handle and writes them
with the engine's table writer below the savepoint's data prefix. It returns the tables
written, or an error message (so the driver reports every failed task, not Spark's trace).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from statelog.checkpoint.metadata import CheckpointMetadata, OperatorState, SubtaskStateHandle
from statelog.errors import StatelogError
from statelog.layout import new_materialization_id, savepoint_data_prefix, table_dir
from statelog.materialization.table_writer import StateTableWriter, new_stats
from statelog.spark.rescale.plan import RestoreTask
from statelog.store import open_store
from statelog.store.local_copies import LocalCopyStore, with_local_copies


def run_task(root: str, store_options: Mapping[str, Any] | None, name: str, task: RestoreTask,
             local_copies: object = None) -> dict[str, Any]:  # fmt: skip
    """Write the state tables of one new subtask; returns the tables (or an error message).
    ``local_copies`` (``statelog.open``'s setting, resolved on the executor's host): the old
    state is read from the copies on this host first, and the result carries their figures."""
    t0 = time.monotonic()
    try:
        store = with_local_copies(open_store(root, dict(store_options or {}) or None), local_copies)
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
        out = {"number": task.number, "operator": mop.to_json(), "stats": stats,
               "seconds": round(time.monotonic() - t0, 3)}  # fmt: skip
        if isinstance(store, LocalCopyStore):
            out["local_copies"] = store.copies.figures()
        return out
    except StatelogError as e:
        return {"number": task.number, "error": f"{type(e).__name__}: {e}"}
    finally:
        store.close()
