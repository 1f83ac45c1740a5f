"""One garbage collection run of a job root: :func:`collect_garbage` (rules: :mod:`materializer.gc`).

It checks its arguments, applies retention (:mod:`materializer.gc.delete`), plans what to
delete (:mod:`materializer.gc.plan`), deletes it and returns the :class:`GcReport`.
"""

from __future__ import annotations

import logging
import math
import time

from materializer.gc.delete import delete_checkpoints, delete_objects
from materializer.gc.plan import plan_deletions
from materializer.gc.report import GcReport
from statelog.checkpoint.catalog import JobCatalog
from statelog.errors import ConfigError
from statelog.following.pin import live_pins
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 600.0


def collect_garbage(
    store: ObjectStore,
    *,
    retain_checkpoints: int | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Delete checkpoints beyond the newest ``retain_checkpoints`` and unreachable objects.

    Deletes only objects below ``changelog/`` and ``materializations/`` that no retained
    checkpoint, savepoint or recent materialization reaches and whose mtime is older than
    ``grace_s`` seconds before ``now`` (default: the current time), and the objects of an
    unpublished savepoint once the newest of them is that old. With ``dry_run`` nothing
    is deleted and the report says what would be. See :mod:`materializer.gc` for the rules.
    Errors reading metadata or deleting objects are reported (``GcReport.errors``) and make
    GC keep whatever they might concern. Refused credentials, a missing bucket and a denied
    permission raise: the first delete the store refuses for lack of permission ends the run
    with a :class:`StorePermissionError` naming the object and the permission, and nothing
    is deleted after it.
    """
    t0 = time.monotonic()
    if retain_checkpoints is not None and (type(retain_checkpoints) is not int or retain_checkpoints < 1):
        raise ConfigError(
            f"retain_checkpoints must be an integer >= 1 (or None to keep every checkpoint), got "
            f"{retain_checkpoints!r}"
        )
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or not 0 <= grace_s < math.inf:
        raise ConfigError(f"grace_s must be a finite number of seconds >= 0, got {grace_s!r}")
    now = time.time() if now is None else float(now)
    cutoff = now - grace_s
    catalog = JobCatalog(store)
    catalog.open_job(None, create=False)  # a root without job.json is an error, never created
    mode = "dry run: " if dry_run else ""
    errors: list[str] = []

    # 1. retention: checkpoint metadata first, oldest first; never a checkpoint a live follower
    # pins (its lease below followers/: statelog/following/pin.py)
    ids = catalog.checkpoint_ids()
    pins, pin_errors = live_pins(store, now)
    errors.extend(pin_errors)
    pinned = {c for pin in pins for c in pin.checkpoint_ids}
    doomed = [c for c in ids[:-retain_checkpoints] if c not in pinned] if retain_checkpoints is not None else []
    deleted_cids = delete_checkpoints(catalog, doomed, dry_run, errors)
    # one that could not be deleted still exists: keep what it references
    retained = [c for c in ids if c not in set(deleted_cids)]
    if deleted_cids:
        log.info("%sretention: deleted checkpoint metadata %s (keeping the newest %d)",
                 mode, deleted_cids, retain_checkpoints)
    kept_for = sorted(pinned & set(ids[:-retain_checkpoints] if retain_checkpoints is not None else ()))
    if kept_for:
        log.info("%sretention: kept checkpoint(s) %s that %d live follower(s) pin", mode, kept_for, len(pins))

    # 2.-4. what is live, what is protected, what may go
    plan = plan_deletions(store, catalog, retained, deleted_cids, cutoff, mode)
    errors.extend(plan.live.errors)

    # 5. delete: manifests before the files they list, segments last
    deleted, deleted_keys = delete_objects(
        store, plan.candidates, dry_run=dry_run, deleted_before=len(deleted_cids), errors=errors, now=now,
        mode=mode,
    )

    report = GcReport(
        root=store.url,
        dry_run=dry_run,
        now=now,
        grace_s=float(grace_s),
        retain_checkpoints=retain_checkpoints,
        checkpoints_retained=tuple(c for c in retained if c not in deleted_cids),
        checkpoints_deleted=tuple(deleted_cids),
        savepoints=tuple(plan.savepoints),
        deleted=deleted.tallies(),
        kept=plan.kept.tallies(),
        protected=plan.protected.tallies(),
        deleted_keys=tuple(deleted_keys),
        errors=tuple(errors),
        duration_s=time.monotonic() - t0,
    )
    log.info(
        "%sGC of %s: deleted %d checkpoint(s), %d segment(s), %d manifest(s), %d table file(s), "
        "%d other object(s), %d bytes in all; kept %d live object(s); %d object(s) protected by the "
        "%gs grace period; %d error(s) in %.2fs",
        mode, store.url, len(deleted_cids), deleted.objects("segments"), deleted.objects("manifests"),
        deleted.objects("table_files"), deleted.objects("other"), report.bytes_deleted, plan.kept.objects(),
        plan.protected.objects(), grace_s, len(errors), report.duration_s,
    )
    for e in errors:
        log.warning("GC: %s", e)
    return report
