"""The ``statelog`` command line: inspect and verify job roots (see ``docs/cli.md``).

A thin shell over the library: the functions here compute plain data (dicts, lists, a
:class:`VerifyReport`), :mod:`tools.output` renders it as ``rich`` tables or JSON. Nothing
here creates or modifies objects: a root is opened read-only through
:class:`~statelog.catalog.JobCatalog`, so a mistyped root is reported, never created.

Exit codes: 0 success, 1 ``verify`` found faults, 2 usage or library error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from statelog.catalog import JOB_KEY, JobCatalog, JobInfo, checkpoint_key, parse_checkpoint_id
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint import ChangelogRange, CheckpointMetadata
from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptionError,
    StatelogError,
    StoreError,
)
from statelog.keys import KeyGroupRange, key_group_range_for_subtask
from statelog.store import open_store, redact_url
from tools import output

log = logging.getLogger("tools.cli")

EXIT_OK, EXIT_FAULTS, EXIT_ERROR = 0, 1, 2
SECRET_OPTIONS = frozenset({"access_key", "secret_key", "session_token"})

# -- store options and roots ---------------------------------------------------------------------


def parse_store_options(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to an options mapping; ``retry.FIELD=N`` builds the retry dict.

    Error messages name the key at most, never a value (values may be secrets).
    """
    options: dict[str, Any] = {}
    for n, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"--store-option #{n} is not of the form KEY=VALUE (e.g. endpoint=http://host:8333)"
            )
        target, name = options, key
        if key.startswith("retry."):
            target, name = options.setdefault("retry", {}), key.split(".", 1)[1]
            value = _number(value, key)
        if name in target or not isinstance(target, dict):
            raise ConfigError(f"--store-option {key} is given twice; give each option once")
        target[name] = value
    return options


def _number(value: str, key: str) -> int | float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--store-option {key} needs a number, got {value!r}") from None
    return int(number) if number.is_integer() and "." not in value else number


def redacted_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: "***" if k in SECRET_OPTIONS else v for k, v in options.items()}


@dataclass
class Root:
    """An opened job root (read-only use): its URL without credentials, and its catalog."""

    url: str
    catalog: JobCatalog

    def require_job(self) -> JobInfo:
        """The job descriptor; a root without one is an error (it is never created here)."""
        return self.catalog.open_job(None, create=False)


@contextlib.contextmanager
def open_root(url: str, options: dict[str, Any]) -> Iterator[Root]:
    log.info("opening %s with store options %s", redact_url(url), redacted_options(options))
    store = open_store(url, options)
    try:
        yield Root(store.url, JobCatalog(store))
    finally:
        store.close()


# -- checkpoints list / show ---------------------------------------------------------------------


def load_metadata(root: Root, cid: int) -> CheckpointMetadata:
    """``catalog.load``, making sure every corruption error names the metadata object."""
    try:
        return root.catalog.load(cid)
    except CorruptionError as e:
        if e.key is not None:
            raise
        key = checkpoint_key(cid)  # nested decoders raise without the object's name
        raise CorruptionError(f"checkpoint metadata {key} is malformed: {e}", key=key) from e


def list_checkpoints(root: Root) -> list[CheckpointMetadata]:
    """Every retained checkpoint, oldest first."""
    root.require_job()
    rows = []
    for cid in root.catalog.checkpoint_ids():
        try:
            rows.append(load_metadata(root, cid))
        except CheckpointNotFoundError:
            log.info("checkpoint %d was removed by retention while listing", cid)
    return rows


def resolve_checkpoint_id(root: Root, which: str) -> int:
    """The retained checkpoint named by ``which`` (an id or ``latest``); errors list them."""
    ids = root.catalog.checkpoint_ids()
    if which.strip().lower() == "latest":
        if not ids:
            raise CheckpointNotFoundError(f"{root.url} has no retained checkpoint yet")
        return ids[-1]
    cid = parse_checkpoint_id(which)
    if cid not in ids:
        raise CheckpointNotFoundError(
            f"checkpoint {cid} does not exist in {root.url}; retained checkpoints: "
            f"{', '.join(map(str, ids)) or 'none'} (see `statelog checkpoints list ROOT`)"
        )
    return cid


def load_checkpoint(root: Root, which: str) -> CheckpointMetadata:
    root.require_job()
    return load_metadata(root, resolve_checkpoint_id(root, which))


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
    ids = [resolve_checkpoint_id(root, checkpoint)] if explicit else root.catalog.checkpoint_ids()
    segments: dict[str, tuple[int, list[int]]] = {}  # name -> (recorded size, referencing ids)
    ranges: dict[ChangelogRange, list[int]] = {}
    for cid in ids:
        meta = v.load(cid, explicit)
        report.checkpoints.append(cid)
        if meta is None:
            continue
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
    report.faults = sorted(v.faults.values(), key=lambda f: (f.object, f.message))
    return report


# -- command line --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    verbose_help = "log progress (-v) or debug details (-vv) to stderr"
    option_help = "store option for open_store, repeatable (e.g. endpoint=http://host:8333)"
    # Global options are accepted before and after the command (separate dests, merged in main).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="count", default=0, dest="verbose_sub", help=verbose_help
    )
    common.add_argument(
        "--store-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="store_option_sub",
        help=option_help,
    )
    parser = argparse.ArgumentParser(
        prog="statelog",
        description="Inspect and verify statelog job roots.",
        epilog="exit codes: 0 ok, 1 verify found faults, 2 usage or statelog error",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=verbose_help)
    parser.add_argument(
        "--store-option", action="append", default=[], metavar="KEY=VALUE", help=option_help
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chk = commands.add_parser("checkpoints", help="list and show retained checkpoints")
    chk_cmds = chk.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)

    def command(group: Any, name: str, handler: Any, text: str) -> argparse.ArgumentParser:
        p = group.add_parser(name, parents=[common], help=text, description=text)
        p.add_argument("root", metavar="ROOT", help="job root: file:///path or s3://bucket/prefix")
        p.add_argument("--json", action="store_true", help="print JSON instead of tables")
        p.set_defaults(handler=handler)
        return p

    command(chk_cmds, "list", cmd_list, "list the retained checkpoints")
    show = command(chk_cmds, "show", cmd_show, "show one checkpoint in detail")
    show.add_argument("checkpoint", metavar="ID", help="checkpoint id, or 'latest'")
    verify = command(
        commands,
        "verify",
        cmd_verify,
        "read and check every object the retained checkpoints reference",
    )
    verify.add_argument("--checkpoint", metavar="ID", help="verify only this checkpoint")
    return parser


def _version() -> str:
    try:
        return version("statelog")
    except PackageNotFoundError:
        return "unknown"


def cmd_list(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        checkpoints = list_checkpoints(root)
    output.checkpoint_list(checkpoints, root.url, as_json=args.json)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        meta = load_checkpoint(root, args.checkpoint)
    output.render_checkpoint(meta, root.url, as_json=args.json)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        report = verify_root(root, args.checkpoint)
    output.verify_report(report.to_json(), as_json=args.json)
    return EXIT_OK if report.ok else EXIT_FAULTS


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 verify faults, 2 errors)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version or a usage error (already printed)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    with output.log_to_stderr(args.verbose + args.verbose_sub):
        try:
            options = parse_store_options([*args.store_option, *args.store_option_sub])
            return int(args.handler(args, options))
        except StatelogError as e:
            output.error(str(e))
            return EXIT_ERROR
        except KeyboardInterrupt:
            output.error("interrupted")
            return 130


if __name__ == "__main__":
    sys.exit(main())
