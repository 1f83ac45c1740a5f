"""The deletions of a GC run: checkpoint metadata first (step 1), then the unreachable objects,
manifests before the files they list and segments last (step 5).

A delete the store refuses for lack of permission ends the run at once with a
:class:`~statelog.errors.StorePermissionError` that says how many objects were deleted before
it; nothing is deleted after it. Other store errors are reported and that object is kept.
"""

from __future__ import annotations

import logging

from materializer.gc.reachable import FATAL_ERRORS
from materializer.gc.report import Counts, category
from statelog.checkpoint.catalog import JobCatalog
from statelog.errors import StoreError, StorePermissionError
from statelog.layout import checkpoint_key
from statelog.store.base import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

# a manifest before the files it lists, so every manifest that exists stays complete
_DELETION_ORDER = {"manifests": 0, "table_files": 1, "other": 2, "segments": 3}


def _denied(e: StorePermissionError, deleted: int) -> StorePermissionError:
    """The error that ends a GC run at its first delete refused for lack of permission."""
    return StorePermissionError(
        f"GC stopped at the first delete the store refused ({deleted} object(s) deleted before it, "
        f"none after it): {e}", key=e.key,
    )


def delete_checkpoints(catalog: JobCatalog, doomed: list[int], dry_run: bool, errors: list[str]) -> list[int]:
    """Delete the metadata of the checkpoints ``doomed``, oldest first; returns the ids deleted
    (with ``dry_run``: that would be). One that could not be deleted is reported in ``errors``
    and still exists."""
    deleted_cids: list[int] = []
    for cid in doomed:
        try:
            if not dry_run:
                catalog.delete(cid)
            deleted_cids.append(cid)
        except StorePermissionError as e:
            raise _denied(e, len(deleted_cids)) from None
        except FATAL_ERRORS:
            raise
        except StoreError as e:
            errors.append(f"could not delete checkpoint metadata {checkpoint_key(cid)}: {e}")
    return deleted_cids


def delete_objects(
    store: ObjectStore, candidates: dict[str, ObjectInfo], *, dry_run: bool, deleted_before: int,
    errors: list[str], now: float, mode: str,
) -> tuple[Counts, list[str]]:
    """Delete ``candidates`` in order (manifests, table files, other, segments); returns what was
    deleted (with ``dry_run``: would be). ``deleted_before`` counts the checkpoint metadata
    this run deleted, for the error that ends it at a denied delete."""
    deleted = Counts()
    deleted_keys: list[str] = []
    for key in sorted(candidates, key=lambda k: (_DELETION_ORDER[category(k)], k)):
        obj = candidates[key]
        if not dry_run:
            try:
                store.delete(key)
            except StorePermissionError as e:
                raise _denied(e, deleted_before + len(deleted_keys)) from None
            except FATAL_ERRORS:
                raise
            except StoreError as e:
                errors.append(f"could not delete {key}: {e}")
                continue
        log.debug("%sdeleted %s (%d bytes, %.0fs old)", mode, key, obj.size, now - obj.mtime)
        deleted.add(obj)
        deleted_keys.append(key)
    return deleted, deleted_keys
