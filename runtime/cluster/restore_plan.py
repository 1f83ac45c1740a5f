"""What a job starts from: the checks before it restores (or refuses to start empty) and the
source splits each worker reads, with their restored positions.

Split ``k`` of a source (in sorted order, the restored ones included) goes to subtask
``k % parallelism``, so a restore at another parallelism redistributes them.
"""

from __future__ import annotations

import logging
from typing import Any

from runtime.errors import NonRestoredStateError
from runtime.graph import StreamGraph
from runtime.network.inflight import INFLIGHT_KEY
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import RestoreRequiredError
from statelog.job import StateJob

log = logging.getLogger(__name__)


def restore_ref(restore: int | str | None, meta: CheckpointMetadata | None) -> int | str | None:
    """How workers name the checkpoint to restore: its id, or ``"savepoint:NAME"``."""
    if meta is None:
        return None
    return restore if meta.kind == "savepoint" else meta.checkpoint_id


def check_fresh_start(job: StateJob, job_name: str) -> None:
    """A run without ``restore=`` on a root with checkpoints would start from empty state
    and repeat the sinks' output: refuse it, naming the newest checkpoint and the choices."""
    latest = job.catalog.latest()
    if latest is not None:
        raise RestoreRequiredError(
            f"the state root {job.root} already has checkpoints (the newest: checkpoint "
            f"{latest.checkpoint_id}, operators {sorted(latest.operators)}); job {job_name!r} "
            f"started without restore= would start from empty state and write its output again. "
            f"Pass restore='latest' (or restore={latest.checkpoint_id}, or 'savepoint:NAME') to "
            f"continue from it, or restore='none' to start fresh on purpose"
        )


def check_restore(meta: CheckpointMetadata, stream: StreamGraph, allow_non_restored_state: bool) -> None:
    """The checkpoint holds only state and positions the job has (or dropping them is allowed)."""
    ops = sorted(set(meta.operators) - stream.stateful_uids())
    srcs = sorted(set(meta.sources) - stream.source_uids() - {INFLIGHT_KEY})
    if (ops or srcs) and not allow_non_restored_state:
        what = []
        if ops:
            what.append(f"state of operator uid(s) {ops}")
        if srcs:
            what.append(f"positions of source uid(s) {srcs}")
        raise NonRestoredStateError(
            f"{meta.kind} {meta.checkpoint_id} holds {' and '.join(what)} that this job does not have "
            f"(its stateful uids: {sorted(stream.stateful_uids())}, sources: {sorted(stream.source_uids())}); "
            "keep the uids, or pass allow_non_restored_state=True to drop that state"
        )
    if ops or srcs:
        log.warning("dropping non-restored state of %s", ops + srcs)


def split_assignments(stream: StreamGraph, parallelism: int,
                      meta: CheckpointMetadata | None) -> list[dict[int, dict[str, Any]]]:  # fmt: skip
    """Per worker: per source node id, its splits and their restored positions (None: from the start)."""
    p = parallelism
    out: list[dict[int, dict[str, Any]]] = [{} for _ in range(p)]
    for node in stream.nodes:
        if node.source is None:
            continue
        restored: dict[str, Any] = dict(meta.sources.get(node.uid or "", {})) if meta is not None else {}
        splits = sorted(set(node.source.splits()) | set(restored))
        for k, split in enumerate(splits):
            out[k % p].setdefault(node.id, {})[split] = restored.get(split)
    return out
