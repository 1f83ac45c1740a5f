"""Checks of a restore job's savepoint before any task runs: its name is free and it can be written.

Credentials that may not write fail here in about a second, not at the first write of a
Spark task; a name in use (a savepoint, or the leftovers of a failed creation) is refused
with the command that removes it.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError, StoreError, StorePermissionError
from statelog.job import StateJob
from statelog.layout import savepoint_metadata_key, savepoint_prefix

log = logging.getLogger(__name__)


def default_name(meta: CheckpointMetadata, parallelism: int | None) -> str:
    stamp = datetime.now(tz=UTC).strftime("%Y%m%dT%H%M%S")
    p = f"-p{parallelism}" if parallelism is not None else ""
    return f"restore-{meta.checkpoint_id}{p}-{stamp}"


def check_name_free(job: StateJob, name: str) -> None:
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
