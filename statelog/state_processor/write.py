"""Writing a savepoint from state tables: the tables of key-group units, then the manifest,
then the savepoint metadata, last (the savepoint exists from that moment).

The layout is the one a job's savepoint has (docs/gc.md, docs/format.md sections 5, 8, 9):
``savepoints/<name>/data/<materialization id>/<file>.parquet``, ``savepoints/<name>/manifest.json``
(kind ``savepoint``) and ``savepoints/<name>/_metadata.json`` (kind ``savepoint``, one handle
per subtask of each operator, each building on the manifest, no changelog). Files are cut at
the units of ``MaterializeOptions.units`` (``ceil(max_parallelism / 16)`` key groups each)
and near ``target_file_bytes`` inside a unit, as a materialization cuts them. The functions
here are what both the in-process :class:`~statelog.state_processor.SavepointWriter` and the
Spark writer's executors and driver call.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import integer_numpy
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata, OperatorState, SubtaskStateHandle
from statelog.descriptors import StateInfo
from statelog.errors import ConfigError, StatelogError, StoreError
from statelog.keys.groups import (
    KeyGroupRange,
    check_max_parallelism,
    check_parallelism,
    key_group_range_for_subtask,
)
from statelog.layout import (
    new_materialization_id,
    savepoint_data_prefix,
    savepoint_manifest_key,
    savepoint_metadata_key,
    savepoint_prefix,
    table_dir,
    table_file_key,
)
from statelog.materialization.manifest import Manifest, MaterializedOperator, TableFile
from statelog.materialization.table_schema import encode_parquet
from statelog.materialization.table_writer import MaterializeOptions
from statelog.state.timers import TIMER_INFOS
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)


def unit_size(max_parallelism: int, options: MaterializeOptions) -> int:
    """Key groups per unit (a table file never spans two units)."""
    return max(1, -(-max_parallelism // options.units))


def unit_ranges(table: pa.Table, max_parallelism: int, options: MaterializeOptions) -> list[tuple[KeyGroupRange, int, int]]:
    """``(unit's key groups, first row, end row)`` of each unit holding rows of a table sorted by key group."""
    n = table.num_rows
    if n == 0:
        return []
    unit = unit_size(max_parallelism, options)
    units = integer_numpy(table.column("key_group")) // unit
    cuts = [0, *(np.flatnonzero(np.diff(units)) + 1).tolist(), n]
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        u = int(units[a])
        out.append((KeyGroupRange(u * unit, min((u + 1) * unit, max_parallelism) - 1), a, b))
    return out


def _split(table: pa.Table, run: KeyGroupRange, target: int) -> list[tuple[KeyGroupRange, pa.Table]]:
    """A unit's table cut at key-group boundaries into pieces near ``target`` bytes."""
    if table.nbytes <= target or len(run) == 1:
        return [(run, table)]
    kgs = integer_numpy(table.column("key_group"))
    ends = [*(np.flatnonzero(np.diff(kgs)) + 1).tolist(), len(kgs)]
    per_row = table.nbytes / max(1, table.num_rows)
    pieces, start_row, start_kg = [], 0, run.start
    for end in ends:
        if (end - start_row) * per_row >= target or end == len(kgs):
            last_kg = run.end if end == len(kgs) else int(kgs[end - 1])
            pieces.append((KeyGroupRange(start_kg, last_kg), table.slice(start_row, end - start_row)))
            start_row, start_kg = end, last_kg + 1
    return pieces


def data_dir(name: str, mid: str) -> str:
    return table_dir(mid, savepoint_data_prefix(name))


def write_tables(store: ObjectStore, dir_: str, op_idx: int, info: StateInfo, table: pa.Table, max_parallelism: int,
                 options: MaterializeOptions, pool: cf.ThreadPoolExecutor) -> list[cf.Future[TableFile]]:
    """Put the state table files of ``table`` (sorted, checked: :func:`to_state_table`), one or
    more per unit; returns the futures of their manifest entries."""
    futures = []
    for run, a, b in unit_ranges(table, max_parallelism, options):
        for kgr, piece in _split(table.slice(a, b - a), run, options.target_file_bytes):
            futures.append(pool.submit(_put_table, store, dir_, op_idx, info, kgr, piece, options))
    return futures


def _put_table(store: ObjectStore, dir_: str, op_idx: int, info: StateInfo, kgr: KeyGroupRange, piece: pa.Table,
               options: MaterializeOptions) -> TableFile:
    data = encode_parquet(piece, options.row_group_rows, options.min_row_group_rows)
    path = table_file_key(dir_, op_idx, info.name, kgr)
    store.put(path, data)
    return TableFile.of(path, kgr, piece.num_rows, data)


def check_name_free(store: ObjectStore, name: str) -> None:
    """Refuse a savepoint name in use (a savepoint, or the leftovers of an unfinished creation)."""
    if store.exists(savepoint_metadata_key(name)):
        raise ConfigError(f"savepoint {name!r} already exists in {store.url}; choose another name (savepoints "
                          f"are write-once; delete it with `statelog savepoint delete ROOT {name}`)")
    leftover = next(iter(store.list(savepoint_prefix(name))), None)
    if leftover is not None:
        raise ConfigError(
            f"savepoint name {name!r} is in use in {store.url}: {leftover.key} exists without savepoint metadata "
            f"(an unfinished or failed write); choose another name or remove the leftovers with "
            f"`statelog savepoint delete ROOT {name}`")


def job_of_root(store: ObjectStore, max_parallelism: int | None) -> tuple[str | None, int]:
    """``(job id, max_parallelism)`` of the root (``None``: no job yet, created at publish)."""
    catalog = JobCatalog(store)
    info = catalog.read_job()
    if info is None:
        if max_parallelism is None:
            raise ConfigError(f"{store.url} holds no job yet: give max_parallelism (the number of key groups, "
                              "fixed for the life of the job)")
        check_max_parallelism(max_parallelism)
        return None, max_parallelism
    if max_parallelism is not None and max_parallelism != info.max_parallelism:
        raise ConfigError(
            f"{store.url} holds job {info.job_id} with max_parallelism {info.max_parallelism}, not {max_parallelism}: "
            "max_parallelism is fixed for the life of a root; write into a new root to change it")
    return info.job_id, info.max_parallelism


@dataclass(frozen=True)
class OperatorTables:
    """What one operator of the savepoint holds: its parallelism, states and files."""

    uid: str
    parallelism: int
    states: tuple[StateInfo, ...]  # user states, in the order given
    files: Mapping[str, Sequence[TableFile]]


def ensure_job(store: ObjectStore, job_id: str | None, max_parallelism: int) -> str:
    """The root's job id; ``job.json`` is created first on a root without a job (before any table)."""
    return job_id if job_id is not None else JobCatalog(store).open_job(max_parallelism, create=True).job_id


def publish(store: ObjectStore, name: str, mid: str, job_id: str, max_parallelism: int, checkpoint_id: int,
            sources: Mapping[str, Any], operators: Iterable[OperatorTables], stats: Mapping[str, Any],
            ) -> CheckpointMetadata:
    """Write the manifest, then the savepoint metadata (last): the savepoint exists on return."""
    ops = list(operators)
    for op in ops:
        check_parallelism(op.parallelism, max_parallelism)
    mops = {}
    for op in ops:
        infos = {i.name: i for i in (*op.states, *TIMER_INFOS)}
        mops[op.uid] = MaterializedOperator(
            uid=op.uid, states=tuple(infos[n] for n in sorted(infos)), covered={},
            files={n: tuple(sorted(fs, key=lambda f: f.key_groups.start)) for n, fs in sorted(op.files.items()) if fs},
        )
    mkey = savepoint_manifest_key(name)
    now = int(time.time() * 1000)
    manifest = Manifest(mid=mid, key=mkey, checkpoint_id=checkpoint_id, job_id=job_id, max_parallelism=max_parallelism,
                        created_ms=now, lease_generation=0, operators=mops, kind="savepoint", stats=dict(stats),
                        savepoint=name)
    data, manifest = manifest.stored()
    store.put(mkey, data)
    handles = {}
    for op in ops:
        infos = (*op.states, *TIMER_INFOS)
        p = op.parallelism
        handles[op.uid] = OperatorState(op.uid, p, tuple(
            SubtaskStateHandle(
                operator_uid=op.uid, subtask=i, parallelism=p, key_groups=key_group_range_for_subtask(max_parallelism, p, i),
                changelog=(), states=infos,
                materialization=(manifest.reference(key_group_range_for_subtask(max_parallelism, p, i)),),
            ) for i in range(p)))
    nfiles = sum(len(fs) for op in mops.values() for fs in op.files.values())
    meta = CheckpointMetadata(
        checkpoint_id=checkpoint_id, job_id=job_id, timestamp_ms=now, max_parallelism=max_parallelism,
        sources=dict(sources), operators=handles, kind="savepoint", savepoint=name,
        stats={"manifest": mkey, "rows": manifest.rows, "bytes": manifest.bytes, "files": nfiles,
               "written_by": "state processor"},
    )
    store.put(savepoint_metadata_key(name), meta.to_bytes())  # the savepoint exists from here
    log.info("savepoint %r written: %d rows in %d files (%d bytes)", name, manifest.rows, nfiles, manifest.bytes)
    return meta


def remove_leftovers(store: ObjectStore, name: str) -> int:
    """Delete every object below the savepoint's prefix (a failed write without metadata); best effort."""
    n = 0
    try:
        for obj in list(store.list(savepoint_prefix(name))):
            if obj.key == savepoint_metadata_key(name):
                continue
            store.delete(obj.key)
            n += 1
    except StoreError as e:
        log.warning("savepoint %r: could not remove what a failed write left below %s (%s); remove it with "
                    "`statelog savepoint delete ROOT %s`", name, savepoint_prefix(name), e, name)
    return n


def new_mid(checkpoint_id: int) -> str:
    return new_materialization_id(checkpoint_id, 0)


def join_files(futures: Sequence[cf.Future[TableFile]]) -> list[TableFile]:
    """The written files; the first failure is raised after every put ended."""
    cf.wait(futures)
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        e = errors[0]
        raise e if isinstance(e, StatelogError) else StatelogError(f"writing a state table failed: {e}")
    return [f.result() for f in futures]
