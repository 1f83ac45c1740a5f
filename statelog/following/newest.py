"""Noticing a newer checkpoint cheaply: what each poll of a follower does first."""

from __future__ import annotations

from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import CheckpointNotFoundError
from statelog.restore.plan import resolve_checkpoint

__all__ = ["newer_checkpoint"]


def newer_checkpoint(
    catalog: JobCatalog, at: int | None, *, job_id: str, max_parallelism: int
) -> tuple[int | None, CheckpointMetadata | None]:
    """``(the newest checkpoint id listed, its metadata)``, the metadata ``None`` when it is
    checkpoint ``at`` (the one the follower's state is at) or there is none. Costs a listing
    of the checkpoint keys; the metadata object is read only when a newer id is listed (ids
    are never reused: a writer numbers its checkpoints after the newest one of the root)."""
    ids = catalog.checkpoint_ids()
    if not ids:
        return None, None
    if ids[-1] == at:
        return ids[-1], None
    try:
        meta = catalog.load(ids[-1])
    except CheckpointNotFoundError:  # (removed by retention since it was listed: the next poll lists again)
        return ids[-1], None
    return ids[-1], resolve_checkpoint(catalog, meta, job_id=job_id, max_parallelism=max_parallelism)
