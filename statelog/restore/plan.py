"""What a restore reads for a checkpoint (or savepoint) and a key-group range.

:func:`resolve_checkpoint` names the checkpoint; :func:`plan_reads` lists, from the handles
and the manifests they build on only, the table files and changelog ranges that hold a
key-group range; :func:`plan_restored` opens an on-demand restore: the timers read now, a
:class:`~statelog.restore.ondemand.loader.KeyGroupLoader` for the rest. The eager restore,
everything read at once, is :mod:`statelog.restore.eager`.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.catalog import JobCatalog, load_savepoint
from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata, SubtaskStateHandle
from statelog.errors import JobMismatchError
from statelog.keys.groups import KeyGroupRange
from statelog.layout import JOB_KEY
from statelog.materialization.manifest import Manifest, load_manifest
from statelog.options.values import parse_checkpoint_ref
from statelog.restore.changes import BaseFile, RestoredChanges
from statelog.restore.collector import gc_paused
from statelog.restore.ondemand.loader import KeyGroupLoader
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.store.base import ObjectStore

__all__ = ["handles_of", "plan_reads", "plan_restored", "resolve_checkpoint", "split_timers"]

log = logging.getLogger(__name__)


def resolve_checkpoint(
    catalog: JobCatalog, which: CheckpointMetadata | int | str | None, *, job_id: str, max_parallelism: int
) -> CheckpointMetadata | None:
    """The metadata ``which`` names: ``None`` for ``None``, ``"none"``, or ``"latest"`` on
    a root without checkpoints. A checkpoint of another job (job id) is refused."""
    if which is None:
        return None
    if isinstance(which, CheckpointMetadata):
        meta = which
    else:
        ref = parse_checkpoint_ref(which, "restore", allow_none=True)  # the one parser
        if ref.kind == "none":
            return None
        if ref.kind == "savepoint":
            assert ref.savepoint is not None
            meta = load_savepoint(catalog.store, ref.savepoint)
        elif ref.kind == "latest":
            meta = catalog.latest()
            if meta is None:
                return None
        else:
            assert ref.checkpoint_id is not None
            meta = catalog.load(ref.checkpoint_id)
    if meta.kind == "checkpoint" and meta.job_id != job_id:
        raise JobMismatchError(
            f"checkpoint {meta.checkpoint_id} of {catalog.store.url} belongs to job {meta.job_id}, but the "
            f"job descriptor {JOB_KEY} names job {job_id}: the descriptor was replaced; put "
            f"the original {JOB_KEY} back, or rebuild it with "
            f"statelog.open(ROOT, recover_descriptor=True) after deleting the wrong one"
        )
    if meta.max_parallelism != max_parallelism:
        raise JobMismatchError(
            f"checkpoint {meta.checkpoint_id} has max_parallelism {meta.max_parallelism}, the job "
            f"has {max_parallelism}"
        )
    return meta


def handles_of(meta: CheckpointMetadata, operator_uid: str, kgr: KeyGroupRange) -> list[SubtaskStateHandle]:
    """The handles of ``operator_uid`` at ``meta`` that overlap key groups ``kgr``."""
    op = meta.operators.get(operator_uid)
    return op.handles_for(kgr) if op is not None else []


def plan_reads(
    reader: SegmentReader,
    handles: list[SubtaskStateHandle],
    key_groups: KeyGroupRange,
    manifests: dict[str, Manifest] | None = None,
    job_id: str | None = None,
) -> tuple[RestoredChanges, list[BaseFile], list[ChangelogRange]]:
    """What a restore of ``key_groups`` reads, from the handles and their manifests only:
    an empty :class:`RestoredChanges` with the state descriptions, the materialized parts
    and the inherited changelog ranges set, the table files (each with its state and the
    key groups to read of it) and the changelog ranges, in replay order. With ``job_id``, the
    manifests the handles build on must belong to that job (every manifest is also checked
    against its key and against the size and CRC-32 its reference recorded)."""
    out = RestoredChanges()
    store = reader.store
    cache = manifests if manifests is not None else {}
    files: list[BaseFile] = []
    ranges: list[ChangelogRange] = []
    for h in handles:
        for info in h.states:
            out.infos.setdefault(info.name, info)
        for part in h.materialization:
            sub = part.restrict(key_groups.intersect(h.key_groups))
            if sub is None:
                continue
            out.parts.append(sub)
            m = load_manifest(store, part, cache, job_id=job_id)
            out.base_checkpoint_id = max(out.base_checkpoint_id, m.checkpoint_id)
            mop = m.operators.get(h.operator_uid)
            if mop is None:
                continue
            for info in mop.states:
                out.infos.setdefault(info.name, info)
                for f in mop.files_for(info.name, sub.key_groups):
                    files.append((info, f, sub.key_groups))
        for rng in h.changelog:
            sub_r = rng.restrict(key_groups)
            if sub_r is not None:
                ranges.append(sub_r)
    out.inherited.extend(ranges)
    return out, files, ranges


def split_timers(
    files: list[BaseFile], ranges: list[ChangelogRange]
) -> tuple[list[BaseFile], list[ChangelogRange], list[BaseFile], list[ChangelogRange]]:
    """``(timer files, timer ranges, other files, other ranges)``: each state has its own
    changelog stream, named ``<prefix>/<state name>`` (docs/format.md 4.7)."""

    def is_timer_range(r: ChangelogRange) -> bool:
        return r.stream.rsplit("/", 1)[-1] in TIMER_STATES

    return (
        [f for f in files if f[0].name in TIMER_STATES],
        [r for r in ranges if is_timer_range(r)],
        [f for f in files if f[0].name not in TIMER_STATES],
        [r for r in ranges if not is_timer_range(r)],
    )


def plan_restored(
    store: ObjectStore,
    meta: CheckpointMetadata,
    operator_uid: str,
    kgr: KeyGroupRange,
    manifests: dict[str, Manifest],
    *,
    disk: bool = False,
    background: bool = True,
    options: OnDemandOptions | None = None,
) -> tuple[RestoredChanges, KeyGroupLoader | None]:
    """An on-demand restore: the handles' plan and the timers now, a loader for the rest
    (``None`` when there is nothing else). ``disk``: for a disk-backed working set;
    ``background``: whether the loader's background thread runs."""
    handles = handles_of(meta, operator_uid, kgr)
    t0 = time.monotonic()
    reader = SegmentReader(store)
    restored, files, ranges = plan_reads(reader, handles, kgr, manifests, job_id=meta.job_id)
    timer_files, timer_ranges, files, ranges = split_timers(files, ranges)
    with gc_paused():
        restored.load(reader, timer_files, timer_ranges)
    if meta.kind == "checkpoint":
        restored.checkpoint_id = meta.checkpoint_id
    options = options or OnDemandOptions()
    loader = (
        KeyGroupLoader(
            store, files, ranges, kgr, background=background, raw_keys=disk,
            # into a disk-backed working set: a key group at a time, one prepared ahead
            options=dataclasses.replace(options, read_ahead=1) if disk else options, max_run=1 if disk else None,
        )
        if files or ranges
        else None
    )  # fmt: skip
    log.info(
        "opened operator %r key groups %s at %s %d on demand: %d table files and %d changelog ranges to "
        "load by key group; timers read in %.3fs",
        operator_uid, kgr, meta.kind, meta.checkpoint_id, len(files), len(ranges), time.monotonic() - t0,
    )  # fmt: skip
    return restored, loader
