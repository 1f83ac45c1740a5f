"""Writing the Parquet state tables of a materialization (format: docs/format.md section 9).

For every operator and subtask handle of a checkpoint, the new image of each state is the
handle's materialized base (parts of earlier manifests) with the handle's changelog ranges
applied (:mod:`statelog.materialization.table_merge`; value-like states and timers merged in Arrow).
Key groups are grouped into fixed units (``units`` per operator, aligned over
``[0, max_parallelism)``); a base file whose key groups are all untouched by the changelog
(for that state) is reused as is, everything else is rewritten. The caller writes the
manifest last (``materializer.build.Materializer``; the restore job writes one for all its
tasks): until it exists, the new files are unreachable leftovers that GC removes after its
grace period.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.metadata import CheckpointMetadata, SubtaskStateHandle
from statelog.compute import pc
from statelog.descriptors import StateInfo, StateKind
from statelog.keys.groups import MAX_MAX_PARALLELISM, KeyGroupRange
from statelog.layout import table_file_key
from statelog.materialization.manifest import (
    Manifest,
    MaterializedOperator,
    TableFile,
    load_manifest,
)
from statelog.materialization.table_image import keep_image
from statelog.materialization.table_merge import merge_last_wins, merge_python
from statelog.materialization.table_reader import read_table_file
from statelog.materialization.table_schema import MIN_ROW_GROUP_ROWS, ROW_GROUP_ROWS, encode_parquet
from statelog.options.base import Options, option
from statelog.options.values import Count, Size
from statelog.store.base import ObjectStore

Progress = Callable[[str, int, int], None]  # (what, done, total)
ROW_GROUP = Count("row_group_rows", 1, 1 << 30)


@dataclass(frozen=True)
class MaterializeOptions(Options):
    """Layout of the state tables (the materializer daemon's ``layout``, ``materialize``,
    savepoints and the restore job)."""

    KIND: ClassVar[str] = "materialize option"

    target_file_bytes: int = option(64 << 20, "files are cut at key-group boundaries near this size",
                                    Size("target_file_bytes", 1, 1 << 40))
    units: int = option(16, "key-group units per operator: the granularity of file reuse",
                        Count("units", 1, MAX_MAX_PARALLELISM))
    row_group_rows: int = option(ROW_GROUP_ROWS, "at most this many rows per row group", ROW_GROUP)
    min_row_group_rows: int = option(MIN_ROW_GROUP_ROWS, "row groups end at a key group's end once they hold "
                                     "this many rows; a key group of this many rows has row groups of its own",
                                     ROW_GROUP)
    upload_threads: int = option(4, "table files written at once", Count("upload_threads", 1, 64))


def _unit_runs(kgs: list[int], unit: int) -> list[KeyGroupRange]:
    """Contiguous runs of sorted key groups, cut at unit boundaries."""
    runs: list[KeyGroupRange] = []
    start = prev = None
    for kg in kgs:
        if start is None:
            start = prev = kg
        elif kg == prev + 1 and kg // unit == start // unit:
            prev = kg
        else:
            runs.append(KeyGroupRange(start, prev))
            start = prev = kg
    if start is not None:
        runs.append(KeyGroupRange(start, prev))
    return runs


def _concat(tables: list[pa.Table]) -> pa.Table | None:
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:  # blocks of several streams with differing schema metadata
        meta = tables[0].schema.metadata
        return pa.concat_tables([t.replace_schema_metadata(meta) for t in tables], promote_options="permissive")


def _kg_filter(table: pa.Table, kgr: KeyGroupRange) -> pa.Table:
    kg = table.column("key_group")
    lo, hi = pc.min_max(kg).values() if table.num_rows else (None, None)
    if lo is None or (lo.as_py() >= kgr.start and hi.as_py() <= kgr.end):
        return table
    return table.filter(pc.and_(pc.greater_equal(kg, kgr.start), pc.less_equal(kg, kgr.end)))


def new_stats() -> dict[str, Any]:
    """The counters a :class:`StateTableWriter` adds to (a manifest's ``stats``)."""
    return {"rows": 0, "files_written": 0, "files_reused": 0, "bytes_written": 0, "bytes_reused": 0,
            "changelog_records": 0, "changelog_bytes": 0, "base_rows_read": 0}


@dataclass(frozen=True)
class UnitWork:
    """A piece of one operator's materialization: key groups ``key_groups`` of ``handle``.

    ``infos`` are the states written for it and ``bases`` the handle's materialized parts
    (key groups, the base manifest's operator). The in-process writer runs one per handle;
    the Spark engine (``materializer.spark``) one per task (:func:`split_units`).
    """

    uid: str
    op_idx: int
    handle: SubtaskStateHandle
    key_groups: KeyGroupRange
    infos: tuple[StateInfo, ...]
    bases: tuple[tuple[KeyGroupRange, MaterializedOperator], ...]


@dataclass(frozen=True)
class OperatorPlan:
    """What :meth:`StateTableWriter.write_operator` writes for one operator, before writing it."""

    uid: str
    unit: int  # key groups per unit
    infos: dict[str, StateInfo]
    covered: dict[str, int]
    works: tuple[UnitWork, ...]  # one per handle, in key-group order

    def result(self, files: dict[str, list[TableFile]]) -> MaterializedOperator:
        """The operator's part of the manifest, given the files written for its works."""
        return MaterializedOperator(
            uid=self.uid,
            states=tuple(self.infos[n] for n in sorted(self.infos)),
            covered=self.covered,
            files={n: tuple(sorted(fs, key=lambda f: f.key_groups.start)) for n, fs in files.items() if fs},
        )


def plan_operator(
    store: ObjectStore,
    meta: CheckpointMetadata,
    uid: str,
    idx: int,
    options: MaterializeOptions,
    manifests: dict[str, Manifest] | None = None,
) -> OperatorPlan:
    """Plan operator ``uid`` of ``meta``: per handle (in key-group order) its base parts and
    the states written for it (those of this and the earlier handles and their bases), and
    the changelog positions the new image covers. Reads only base manifests."""
    op = meta.operators[uid]
    manifests = manifests if manifests is not None else {}
    infos: dict[str, StateInfo] = {}
    covered: dict[str, int] = {}
    works = []
    for h in sorted(op.subtasks, key=lambda h: h.key_groups.start):
        for r in h.changelog:
            covered[r.stream] = max(covered.get(r.stream, 0), r.end)
        for info in h.states:
            infos.setdefault(info.name, info)
        bases = []
        for part in h.materialization:
            m = load_manifest(store, part, manifests, job_id=meta.job_id)
            mop = m.operators.get(uid)
            if mop is None:
                continue
            for info in mop.states:
                infos.setdefault(info.name, info)
            # the image includes the base's, so it covers what the base covered too (a backend
            # that adopts it must not reference those records again)
            for stream, end in mop.covered.items():
                covered[stream] = max(covered.get(stream, 0), end)
            bases.append((part.key_groups.intersect(h.key_groups), mop))
        works.append(UnitWork(uid, idx, h, h.key_groups, tuple(info for _, info in sorted(infos.items())),
                              tuple(bases)))
    unit = max(1, -(-meta.max_parallelism // options.units))
    return OperatorPlan(uid, unit, infos, covered, tuple(works))


def split_units(work: UnitWork, unit: int) -> list[UnitWork]:
    """``work`` cut at unit boundaries, except where a base file spans the boundary (then the
    units on both sides stay together): each piece then decides reuse and writes files
    exactly as the whole would, so the tables equal :meth:`StateTableWriter.write_operator`'s."""
    kgr = work.key_groups
    cuts = {b for b in range(kgr.start + 1, kgr.end + 1) if b % unit == 0}
    for part_kgr, mop in work.bases:
        for fs in mop.files.values():
            for f in fs:
                if not f.key_groups.intersect(part_kgr).is_empty:
                    cuts -= set(range(f.key_groups.start + 1, f.key_groups.end + 1))
    pieces = []
    start = kgr.start
    for b in sorted(cuts) + [kgr.end + 1]:
        pieces.append(replace(work, key_groups=KeyGroupRange(start, b - 1)))
        start = b
    return pieces


class StateTableWriter:
    """Writes the Parquet state tables of a checkpoint's operators: per subtask handle, its
    materialized base with its changelog ranges applied (:mod:`statelog.restore.appliers`).

    The materializer (``materializer.build.Materializer``) writes a materialization with
    it and publishes the manifest; the restore job (:mod:`statelog.spark.rescale`) writes
    a savepoint's tables. Use it as a context manager: uploads run on a thread pool that
    ``__exit__`` joins.
    """

    def __init__(
        self,
        store: ObjectStore,
        options: MaterializeOptions | None = None,
        progress: Progress | None = None,
        manifests: dict[str, Manifest] | None = None,
    ) -> None:
        self.store = store
        self.options = options or MaterializeOptions()
        self.progress = progress
        self._manifests = manifests if manifests is not None else {}
        self._pool: cf.ThreadPoolExecutor | None = None

    def __enter__(self) -> StateTableWriter:
        self._pool = cf.ThreadPoolExecutor(self.options.upload_threads, thread_name_prefix="statelog-mat")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._pool is not None
        self._pool.shutdown(wait=True)
        self._pool = None

    # -- per operator ---------------------------------------------------------------------------

    def write_operator(
        self, meta: CheckpointMetadata, uid: str, idx: int, dir_: str, self_contained: bool, stats: dict
    ) -> MaterializedOperator:
        """Write the tables of operator ``uid`` (the ``idx``-th of the checkpoint) below
        ``dir_``; files of the bases whose key groups saw no change are reused unless
        ``self_contained``. Adds to ``stats`` (:func:`new_stats`)."""
        plan = plan_operator(self.store, meta, uid, idx, self.options, self._manifests)
        files: dict[str, list[TableFile]] = {}
        futures: list[cf.Future[Any]] = []
        for n, work in enumerate(plan.works):
            if self.progress:
                self.progress(f"{uid}: subtask state {n + 1}/{len(plan.works)}", n, len(plan.works))
            self._unit(work, plan.unit, dir_, self_contained, files, futures, stats)
        for f in futures:
            f.result()
        return plan.result(files)

    def write_unit(self, work: UnitWork, unit: int, dir_: str, self_contained: bool,
                   stats: dict) -> dict[str, list[TableFile]]:
        """Write the tables of one unit of work (a Spark task of ``materializer.spark``);
        returns the files per state (written when this returns)."""
        files: dict[str, list[TableFile]] = {}
        futures: list[cf.Future[Any]] = []
        self._unit(work, unit, dir_, self_contained, files, futures, stats)
        for f in futures:
            f.result()
        return files

    def _unit(self, work: UnitWork, unit: int, dir_: str, self_contained: bool, files: dict[str, list[TableFile]],
              futures: list[cf.Future[Any]], stats: dict) -> None:
        tail = self._read_tail(work.handle, work.key_groups, stats)
        bases = [(inter, mop) for part_kgr, mop in work.bases
                 if not (inter := part_kgr.intersect(work.key_groups)).is_empty]
        for info in work.infos:
            out = files.setdefault(info.name, [])
            self._state(info, work.key_groups, bases, tail.get(info.name, []), unit, work.op_idx, dir_,
                        self_contained, out, futures, stats)

    def _read_tail(self, h: SubtaskStateHandle, kgr: KeyGroupRange, stats: dict) -> dict[str, list[pa.Table]]:
        """The handle's change records of key groups ``kgr`` per state as Arrow tables, in replay order."""
        reader = SegmentReader(self.store)
        out: dict[str, list[pa.Table]] = {}
        for r in h.changelog:
            sub = r.restrict(kgr)
            if sub is None:
                continue
            for batch in reader.read_range(sub.stream, sub.start, sub.end, sub.key_groups, sub.segments):
                out.setdefault(batch.state, []).append(batch.table)
                stats["changelog_records"] += batch.table.num_rows
        stats["changelog_bytes"] += reader.bytes_read
        return out

    def _state(
        self,
        info: StateInfo,
        kgr: KeyGroupRange,
        bases: list[tuple[KeyGroupRange, MaterializedOperator]],
        tail_tables: list[pa.Table],
        unit: int,
        op_idx: int,
        dir_: str,
        self_contained: bool,
        out: list[TableFile],
        futures: list[cf.Future[Any]],
        stats: dict,
    ) -> None:
        # the tail sorted by key group (a stable sort keeps each entry's records in order),
        # with each key group's row span
        tail_all = _concat(tail_tables)
        spans: dict[int, tuple[int, int]] = {}
        if tail_all is not None:
            tail_all = tail_all.take(pc.sort_indices(tail_all, sort_keys=[("key_group", "ascending")]))
            pos = 0
            for vc in pc.value_counts(tail_all.column("key_group")).to_pylist():
                spans[vc["values"]] = (pos, pos + vc["counts"])
                pos += vc["counts"]
        touched = set(spans)
        reused: set[int] = set()
        base_files: list[tuple[KeyGroupRange, TableFile]] = []
        for part_kgr, mop in bases:
            for f in mop.files_for(info.name, part_kgr):
                inside = f.key_groups.intersect(part_kgr) == f.key_groups
                if inside and not self_contained and not any(kg in touched for kg in f.key_groups):
                    out.append(f)
                    reused.update(f.key_groups)
                    stats["files_reused"] += 1
                    stats["bytes_reused"] += f.bytes
                    stats["rows"] += f.rows
                else:
                    base_files.append((part_kgr, f))
        dirty = [kg for kg in kgr if kg not in reused]
        vectorized = info.name in TIMER_STATES or info.kind not in (StateKind.LIST, StateKind.MAP)
        cache: dict[str, pa.Table] = {}
        for run in _unit_runs(dirty, unit):
            base: list[pa.Table] = []
            for part_kgr, f in base_files:
                sub = f.key_groups.intersect(part_kgr).intersect(run)
                if sub.is_empty:
                    continue
                table = cache.get(f.path)
                if table is None:
                    table = cache[f.path] = read_table_file(self.store, f, f.key_groups, info)
                    stats["base_rows_read"] += table.num_rows
                base.append(_kg_filter(table, sub))
            tail = []
            in_run = [spans[kg] for kg in run if kg in spans]
            if in_run and tail_all is not None:
                lo, hi = min(a for a, _ in in_run), max(b for _, b in in_run)
                tail = [tail_all.slice(lo, hi - lo)]
            if vectorized:
                table = merge_last_wins(info, base, tail)
            else:
                table = merge_python(info, base, tail)
            if table is None or table.num_rows == 0:
                continue
            for piece in self._split(table, run):
                self._write(info, piece, op_idx, dir_, out, futures, stats)

    def _split(self, table: pa.Table, run: KeyGroupRange) -> list[tuple[KeyGroupRange, pa.Table]]:
        """Cut a run's table at key-group boundaries into pieces near the target file size."""
        target = self.options.target_file_bytes
        if table.nbytes <= target or len(run) == 1:
            return [(run, table)]
        kgs = table.column("key_group").to_pylist()
        per_row = table.nbytes / max(1, table.num_rows)
        pieces = []
        start_row, start_kg = 0, run.start
        for i in range(1, len(kgs) + 1):
            end_of_kg = i == len(kgs) or kgs[i] != kgs[i - 1]
            if end_of_kg and ((i - start_row) * per_row >= target or i == len(kgs)):
                last_kg = run.end if i == len(kgs) else kgs[i - 1]
                pieces.append((KeyGroupRange(start_kg, last_kg), table.slice(start_row, i - start_row)))
                start_row, start_kg = i, last_kg + 1
        return pieces

    def _write(
        self,
        info: StateInfo,
        piece: tuple[KeyGroupRange, pa.Table],
        op_idx: int,
        dir_: str,
        out: list[TableFile],
        futures: list[cf.Future[Any]],
        stats: dict,
    ) -> None:
        kgr, table = piece
        data = encode_parquet(table, self.options.row_group_rows, self.options.min_row_group_rows)
        path = table_file_key(dir_, op_idx, info.name, kgr)
        f = TableFile.of(path, kgr, table.num_rows, data)
        out.append(f)
        stats["files_written"] += 1
        stats["bytes_written"] += len(data)
        stats["rows"] += table.num_rows
        assert self._pool is not None
        futures.append(self._pool.submit(self.store.put, path, data))
        if self.store.local_copies is not None:  # this host's next restore maps the rows decoded
            futures.append(self._pool.submit(keep_image, self.store, table, f))
