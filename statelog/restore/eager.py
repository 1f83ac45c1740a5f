"""The eager restore: everything a key-group range holds read at once.

:func:`read_restored` reads a checkpoint's handles of one operator restricted to the key
groups of the restoring subtask (:func:`read_changes`): the materialized base tables
(manifests verified against their references and the job; table files fetched and decoded by
a thread pool) and the changelog tail after them, grouped per state in replay order. The
backend (:class:`statelog.state.backend.KeyedStateBackend`) turns them into state when a state
registers (:func:`~statelog.restore.changes.base_entries` for the base tables, then the
records through the kind's applier) and the timers at once (:func:`restore_timers`), with
the cyclic garbage collector paused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.metadata import CheckpointMetadata, SubtaskStateHandle
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest
from statelog.restore.changes import RestoredChanges
from statelog.restore.collector import gc_paused
from statelog.restore.plan import handles_of, plan_reads
from statelog.state.timers import TimerService
from statelog.store.base import ObjectStore

__all__ = ["read_changes", "read_restored", "restore_timers"]

log = logging.getLogger(__name__)


def read_changes(
    reader: SegmentReader,
    handles: list[SubtaskStateHandle],
    key_groups: KeyGroupRange,
    manifests: dict[str, Manifest] | None = None,
    job_id: str | None = None,
    images: bool = False,
) -> RestoredChanges:
    """Read what ``handles`` hold in ``key_groups`` (:func:`~statelog.restore.plan.plan_reads`,
    then :meth:`RestoredChanges.load`); with ``job_id``, the manifests they build on must
    belong to that job; ``images``: tables from their local table images where there are any
    (decoded int64 keys: for a backend)."""
    out, files, ranges = plan_reads(reader, handles, key_groups, manifests, job_id)
    out.load(reader, files, ranges, images)
    return out


def read_restored(
    store: ObjectStore, meta: CheckpointMetadata, operator_uid: str, kgr: KeyGroupRange, manifests: dict[str, Manifest],
    images: bool = False,
) -> RestoredChanges:
    """Everything ``operator_uid`` holds in key groups ``kgr`` at ``meta`` (a checkpoint or a
    savepoint), read at once; ``images``: as :func:`read_changes`."""
    handles = handles_of(meta, operator_uid, kgr)
    t0 = time.monotonic()
    with gc_paused():
        restored = read_changes(SegmentReader(store), handles, kgr, manifests, job_id=meta.job_id, images=images)
    if meta.kind == "checkpoint":
        restored.checkpoint_id = meta.checkpoint_id
    log.info(
        "restored operator %r key groups %s from %s %d: %d materialized rows, %d change records, "
        "%d bytes in %.3fs",
        operator_uid, kgr, meta.kind, meta.checkpoint_id, restored.base_rows, restored.records_read,
        restored.bytes_read, time.monotonic() - t0,
    )
    return restored


def restore_timers(restored: RestoredChanges, timers: TimerService, check_keys: Callable[[str, Any], None]) -> None:
    """Install the restored timers (tables, then records) into ``timers``;
    ``check_keys(state, key_array)`` raises on keys the backend cannot restore."""
    for d, name in enumerate(TIMER_STATES):
        for table in restored.base.pop(name, ()):
            check_keys(name, table.column("key"))
            check_keys(name, table.column("namespace"))
            timers._sets[d].update(
                zip(
                    table.column("timestamp").to_pylist(),
                    table.column("key").to_pylist(),
                    table.column("namespace").to_pylist(),
                    strict=True,
                )
            )
        records = restored.records.pop(name, ())
        if records:
            check_keys(name, pa.array({b for r in records for b in r[:2]}, pa.binary()))
        for kb, nsb, op, _ukey, value, _exp in records:
            timers.apply(d, kb, nsb, op, value)
