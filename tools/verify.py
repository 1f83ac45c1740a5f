"""``statelog verify``: read and check every object the retained checkpoints reference."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.catalog import JobInfo, load_savepoint, savepoint_names
from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata, MaterializedPart
from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptionError,
    StoreError,
)
from statelog.keys.groups import KeyGroupRange, key_group_range_for_subtask
from statelog.layout import JOB_KEY, checkpoint_key, savepoint_metadata_key
from statelog.materialization.manifest import TableFile, check_reference, load_manifest
from statelog.materialization.table_reader import read_table_file
from tools.roots import Root, load_metadata, resolve_checkpoint_id

log = logging.getLogger("tools.cli")



# -- verify --------------------------------------------------------------------------------------


@dataclass
class Fault:
    object: str  # object key below the root
    error: str  # exception class name
    message: str
    checkpoints: list[int] = field(default_factory=list)


@dataclass
class VerifyReport:
    root: str
    job_id: str | None = None
    checkpoints: list[int] = field(default_factory=list)
    segments_checked: int = 0
    bytes_checked: int = 0
    ranges_checked: int = 0
    records_checked: int = 0
    manifests_checked: int = 0
    table_files_checked: int = 0
    savepoints: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults

    def to_json(self) -> dict[str, Any]:
        out = {"ok": self.ok, **asdict(self)}
        out["checkpoints_checked"] = len(self.checkpoints)
        return out


_FATAL = (AuthenticationError, BucketNotFoundError)  # nothing can be checked: abort (exit 2)


class _Check:
    failed = False


class _Verifier:
    def __init__(self, root: Root, report: VerifyReport) -> None:
        self.root, self.report = root, report
        self.store = root.catalog.store
        self.faults: dict[tuple[str, str], Fault] = {}

    def fault(self, key: str, exc: BaseException | str, cids: Sequence[int] = ()) -> None:
        error = type(exc).__name__ if isinstance(exc, BaseException) else "CorruptionError"
        fault = self.faults.get((key, str(exc)))
        if fault is None:
            fault = self.faults[(key, str(exc))] = Fault(key, error, str(exc))
            log.info("fault in %s: %s", key, exc)
        fault.checkpoints = sorted(set(fault.checkpoints) | set(cids))

    @contextlib.contextmanager
    def check(self, key: str, cids: Sequence[int] = ()) -> Iterator[_Check]:
        """Record a corruption or store error inside the block as a fault of ``key``."""
        outcome = _Check()
        try:
            yield outcome
        except _FATAL:
            raise
        except (CorruptionError, StoreError) as e:
            outcome.failed = True
            self.fault(e.key or key, e, cids)

    def check_job(self) -> JobInfo | None:
        info = None
        with self.check(JOB_KEY) as c:
            info = self.root.catalog.read_job()
        if c.failed:
            return None
        return info if info is not None else self.root.require_job()  # raises: not a job root

    def load(self, cid: int, explicit: bool) -> CheckpointMetadata | None:
        with self.check(checkpoint_key(cid), [cid]):
            try:
                return load_metadata(self.root, cid)
            except CheckpointNotFoundError:
                if explicit:
                    raise
                log.info("checkpoint %d was removed by retention during verify", cid)
        return None

    def check_metadata(self, meta: CheckpointMetadata, job: JobInfo | None) -> None:
        """Consistency of one checkpoint's metadata with the job and with itself."""
        key, cid, maxp = (
            checkpoint_key(meta.checkpoint_id),
            [meta.checkpoint_id],
            meta.max_parallelism,
        )
        if job is not None and (meta.job_id, maxp) != (job.job_id, job.max_parallelism):
            self.fault(
                key,
                f"checkpoint metadata {key} belongs to job {meta.job_id} with "
                f"max_parallelism {maxp}, the root holds job {job.job_id} with "
                f"max_parallelism {job.max_parallelism}",
                cid,
            )
        for uid, op in sorted(meta.operators.items()):
            subtasks = [h.subtask for h in op.subtasks]
            if subtasks != list(range(op.parallelism)):
                self.fault(
                    key,
                    f"{key}: operator {uid!r} has subtasks {subtasks}, expected "
                    f"0..{op.parallelism - 1}",
                    cid,
                )
                continue
            for h in op.subtasks:
                where = f"{key}: operator {uid!r} subtask {h.subtask}"
                try:
                    expected = key_group_range_for_subtask(maxp, op.parallelism, h.subtask)
                except ConfigError as e:
                    self.fault(key, f"{where}: {e}", cid)
                    continue
                if h.key_groups != expected:
                    self.fault(
                        key, f"{where} has key groups {h.key_groups}, expected {expected}", cid
                    )
                for r in h.changelog:
                    if problem := _range_problem(r, expected):
                        self.fault(
                            key, f"{where}: changelog range of stream {r.stream} {problem}", cid
                        )

    def check_segment(self, name: str, size: int, cids: list[int]) -> bool:
        """Read and check every byte of one segment; True if it is sound."""
        with self.check(name, cids) as c:
            info = self.store.head(name)
            if info is None:
                raise CorruptionError(
                    f"changelog segment {name} is missing from the store", key=name
                )
            if info.size != size:
                raise CorruptionError(
                    f"changelog segment {name} is {info.size} bytes, the "
                    f"checkpoints recorded {size}",
                    key=name,
                )
            SegmentReader(self.store).verify_segment(name, size)
            self.report.segments_checked += 1
            self.report.bytes_checked += size
        return not c.failed

    def check_range(self, r: ChangelogRange, cids: list[int]) -> None:
        """Read the range as a restore does (sequence and key-group filters included)."""
        reader, seqs, rows = SegmentReader(self.store), [], 0
        with self.check(r.segments[0].name, cids) as c:
            for seg in r.segments:
                spans = reader.footer(seg.name, seg.size).streams
                if not any(
                    (s.stream, s.start, s.end) == (r.stream, seg.start, seg.end) for s in spans
                ):
                    raise CorruptionError(
                        f"changelog segment {seg.name} does not hold records "
                        f"[{seg.start}, {seg.end}) of stream {r.stream}, which "
                        "the checkpoint metadata references",
                        key=seg.name,
                    )
            for batch in reader.read_range(r.stream, r.start, r.end, r.key_groups, r.segments):
                kg, seq = batch.table.column("key_group"), batch.table.column("seq")
                if pc.min(kg).as_py() < r.key_groups.start or pc.max(kg).as_py() > r.key_groups.end:
                    raise CorruptionError(
                        f"stream {r.stream}: records outside key groups {r.key_groups} read back"
                    )
                seqs.append(seq.combine_chunks())
                rows += batch.table.num_rows
            if seqs:
                all_seqs = pa.chunked_array(seqs)
                lo, hi = pc.min(all_seqs).as_py(), pc.max(all_seqs).as_py()
                if lo < r.start or hi >= r.end or pc.count_distinct(all_seqs).as_py() != rows:
                    raise CorruptionError(
                        f"stream {r.stream}: records [{r.start}, {r.end}) read "
                        "back with duplicate or out-of-range sequence numbers"
                    )
        if not c.failed:
            self.report.ranges_checked += 1
            self.report.records_checked += rows


    def check_manifest(
        self,
        key: str,
        uses: list[tuple[str, Any]],
        cids: list[int],
        refs: Sequence[MaterializedPart] = (),
        job_id: str | None = None,
    ) -> list[TableFile]:
        """Load and check one manifest; returns the table files the checkpoints reference.

        The manifest must be the one its key names, of the root's job, and have the size and
        CRC-32 that every reference to it recorded.
        """
        files: list[TableFile] = []
        with self.check(key, cids):
            m = load_manifest(self.store, key, job_id=job_id)
            for ref in refs:
                check_reference(m, ref)
            self.report.manifests_checked += 1
            for uid, kgr in uses:
                mop = m.operators.get(uid)
                if mop is None:
                    raise CorruptionError(
                        f"materialization manifest {key} holds no state of operator {uid!r}, which "
                        "the checkpoint metadata builds on it",
                        key=key,
                    )
                for fs in mop.files.values():
                    files.extend(f for f in fs if not f.key_groups.intersect(kgr).is_empty)
        return files

    def check_table_file(self, f: TableFile, cids: list[int]) -> None:
        """Read a whole state table: size, CRC-32, Parquet page checksums, key-group range."""
        with self.check(f.path, cids) as c:
            table = read_table_file(self.store, f, f.key_groups)
            if table.num_rows != f.rows:
                raise CorruptionError(
                    f"state table {f.path} has {table.num_rows} rows, its manifest says {f.rows}", key=f.path
                )
            if table.num_rows:
                kg = table.column("key_group")
                if pc.min(kg).as_py() < f.key_groups.start or pc.max(kg).as_py() > f.key_groups.end:
                    raise CorruptionError(
                        f"state table {f.path} holds rows outside its key groups {f.key_groups}", key=f.path
                    )
        if not c.failed:
            self.report.table_files_checked += 1
            self.report.bytes_checked += f.bytes


def _range_problem(r: ChangelogRange, owned: KeyGroupRange) -> str | None:
    """Why a changelog range is inconsistent in itself (metadata only), or None."""
    if r.start < 0 or r.end < r.start:
        return f"has an invalid sequence range [{r.start}, {r.end})"
    if r.key_groups.is_empty or r.key_groups.intersect(owned) != r.key_groups:
        return f"has key groups {r.key_groups} outside the subtask's {owned}"
    pos = r.start
    for seg in sorted(r.segments, key=lambda s: s.start):
        if seg.start > pos:
            break
        pos = max(pos, seg.end)
    if pos < r.end:
        return (
            f"[{r.start}, {r.end}) is not covered by its segments: records from {pos} are missing"
        )
    return None


def verify_root(root: Root, checkpoint: str | None = None) -> VerifyReport:
    """Check the job descriptor, every retained checkpoint (or one) and all it references."""
    report = VerifyReport(root.url)
    v = _Verifier(root, report)
    job = v.check_job()
    report.job_id = job.job_id if job else None
    explicit = checkpoint is not None
    ids = [resolve_checkpoint_id(root, checkpoint, "--checkpoint")] if explicit else root.catalog.checkpoint_ids()
    segments: dict[str, tuple[int, list[int]]] = {}  # name -> (recorded size, referencing ids)
    ranges: dict[ChangelogRange, list[int]] = {}
    metas: list[CheckpointMetadata] = []
    for cid in ids:
        meta = v.load(cid, explicit)
        report.checkpoints.append(cid)
        if meta is None:
            continue
        metas.append(meta)
        log.info("checking checkpoint %d", cid)
        v.check_metadata(meta, job)
        for op in meta.operators.values():
            for h in op.subtasks:
                for r in h.changelog:
                    ranges.setdefault(r, []).append(cid)
                    for s in r.segments:
                        size, refs = segments.setdefault(s.name, (s.size, []))
                        refs.append(cid)
                        if size != s.size:
                            v.fault(
                                checkpoint_key(cid),
                                f"{checkpoint_key(cid)} records segment "
                                f"{s.name} as {s.size} bytes, another checkpoint as {size}",
                                [cid],
                            )
    sound = set()
    for name, (size, refs) in sorted(segments.items()):
        log.info("verifying segment %s (%d bytes)", name, size)
        if v.check_segment(name, size, sorted(set(refs))):
            sound.add(name)
    for r, refs in ranges.items():
        if r.segments and all(s.name in sound for s in r.segments):
            v.check_range(r, sorted(set(refs)))
    if not explicit:  # savepoints are restorable like checkpoints: verify them too
        for name in savepoint_names(root.catalog.store):
            key = savepoint_metadata_key(name)
            with v.check(key) as c:
                sp = load_savepoint(root.catalog.store, name)
            report.savepoints.append(name)
            if not c.failed:
                metas.append(sp)
    uses: dict[str, dict[tuple[str, Any], list[int]]] = {}
    bindings: dict[str, dict[tuple[int | None, int | None], MaterializedPart]] = {}
    for meta in metas:
        for uid, op in meta.operators.items():
            for h in op.subtasks:
                for part in h.materialization:
                    uses.setdefault(part.manifest, {}).setdefault((uid, part.key_groups), []).append(meta.checkpoint_id)
                    bindings.setdefault(part.manifest, {}).setdefault((part.bytes, part.crc32), part)
    table_files: dict[str, tuple[TableFile, list[int]]] = {}
    for key, by_use in sorted(uses.items()):
        cids = sorted({c for refs in by_use.values() for c in refs})
        log.info("verifying materialization %s", key)
        refs = list(bindings[key].values())
        for f in v.check_manifest(key, list(by_use), cids, refs, job.job_id if job else None):
            table_files.setdefault(f.path, (f, cids))
    for _path, (f, cids) in sorted(table_files.items()):
        v.check_table_file(f, cids)
    report.faults = sorted(v.faults.values(), key=lambda f: (f.object, f.message))
    return report


