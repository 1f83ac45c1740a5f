"""``statelog gc``, ``statelog savepoint ...`` and ``statelog verify`` (``docs/cli.md``, ``docs/gc.md``).

``gc`` and ``savepoint`` write to the job root: ``gc`` deletes checkpoint metadata (with
``--retain``) and unreachable objects, ``savepoint create`` writes a savepoint, ``savepoint
delete`` removes one. The work is done by :mod:`materializer.gc` and
:mod:`materializer.savepoint`. ``verify`` only reads: :func:`tools.verify.verify_root` reads
and checks every object the retained checkpoints and the savepoints reference. This module
parses arguments and renders the results (JSON with ``--json``, else ``rich`` tables). Exit
codes: 0 ok, 1 ``gc`` completed with errors (something could not be read or deleted; it is
reported and kept) or ``verify`` found faults, 2 usage or library error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from materializer.gc.collect import collect_garbage
from materializer.options import GC_GRACE
from materializer.savepoint import (
    create_savepoint,
    delete_savepoint,
    list_savepoints,
    savepoint_summary,
)
from statelog.errors import ConfigError
from statelog.layout import check_savepoint_name
from statelog.options import values
from statelog.options.engine import RETAIN
from tools.cli.output import NONE, _console, _json, _row, _table, human_bytes
from tools.roots import Root, open_root, resolve_checkpoint_id
from tools.verify import verify_root

log = logging.getLogger("tools.cli")

EXIT_OK, EXIT_FAULTS = 0, 1

# -- argument values -----------------------------------------------------------------------------

def parse_duration(text: str, option: str = "duration") -> float:
    """``"30s"``, ``"10m"``, ``"1h"``, ``"500ms"``, ``"2d"`` or plain seconds, named by ``option``."""
    try:
        return values.parse_duration(text)
    except ConfigError as e:
        raise ConfigError(f"{option}: {e}") from None


# -- commands: their arguments (their names and help texts are in tools.cli.commands) ----------


def declare_gc(gc: argparse.ArgumentParser) -> None:
    gc.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    gc.add_argument("--retain", metavar="N", default=None,
                    help="also delete the metadata of all but the newest N checkpoints (default: keep all)")
    gc.add_argument("--grace", metavar="DURATION", default="10m",
                    help="delete unreferenced objects only when older than this (default 10m; e.g. 30s, 1h, 0)")


def declare_savepoint_create(create: argparse.ArgumentParser) -> None:
    create.add_argument("--checkpoint", metavar="ID", required=True, help="checkpoint id, or 'latest'")
    create.add_argument("--name", metavar="NAME", required=True,
                        help="savepoint name: letters, digits, '.', '_', '-' (at most 100)")


def declare_savepoint_delete(delete: argparse.ArgumentParser) -> None:
    delete.add_argument("name", metavar="NAME", help="the savepoint to delete")
    delete.add_argument("--force", action="store_true",
                        help="delete even if retained checkpoints still build on the savepoint's files")


def declare_verify(verify: argparse.ArgumentParser) -> None:
    verify.add_argument("--checkpoint", metavar="ID", help="verify only this checkpoint")


@contextlib.contextmanager
def _session(args: argparse.Namespace, options: dict[str, Any]) -> Iterator[Root]:
    """The opened root, which must hold a job (logging to stderr is set up by ``tools.cli``)."""
    with open_root(args.root, options) as root:
        root.require_job()
        yield root


def cmd_gc(args: argparse.Namespace, options: dict[str, Any]) -> int:
    grace = GC_GRACE.check(args.grace, "--grace")  # ranges: materializer/options.py
    retain = None if args.retain is None else RETAIN.check(args.retain, "--retain")
    with _session(args, options) as root:
        report = collect_garbage(root.catalog.store, retain_checkpoints=retain, grace_s=grace, dry_run=args.dry_run)
    data = report.to_json()
    render_gc(data, as_json=args.json)
    return EXIT_OK if report.ok else EXIT_FAULTS


def cmd_savepoint_create(args: argparse.Namespace, options: dict[str, Any]) -> int:
    name = check_savepoint_name(args.name)
    with _session(args, options) as root:
        cid = resolve_checkpoint_id(root, args.checkpoint, "--checkpoint")
        meta = create_savepoint(root.catalog.store, cid, name)
        summary = savepoint_summary(root.catalog.store, meta, name)
    render_savepoint_created(summary, root.url, as_json=args.json)
    return EXIT_OK


def cmd_savepoint_list(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with _session(args, options) as root:
        rows = list_savepoints(root.catalog.store)
    render_savepoint_list(rows, root.url, as_json=args.json)
    return EXIT_OK


def cmd_savepoint_delete(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with _session(args, options) as root:
        result = delete_savepoint(root.catalog.store, args.name, force=args.force)
    render_savepoint_deleted(result, root.url, as_json=args.json)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        report = verify_root(root, args.checkpoint)
    verify_report(report.to_json(), as_json=args.json)
    return EXIT_OK if report.ok else EXIT_FAULTS


# -- rendering -----------------------------------------------------------------------------------


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids)) or "none"


def render_gc(report: Mapping[str, Any], *, as_json: bool) -> None:
    if as_json:
        _json(dict(report))
        return
    console = _console()
    verb = "would delete" if report["dry_run"] else "deleted"
    title = f"Garbage collection of {report['root']}" + (" (dry run: nothing deleted)" if report["dry_run"] else "")
    table = _table(title, "objects", verb, "bytes", "kept (live)", "protected (grace)",
                   right=(verb, "bytes", "kept (live)", "protected (grace)"))
    names = {"segments": "changelog segments", "manifests": "materialization manifests",
             "table_files": "state table files", "other": "other objects"}
    for cat, label in names.items():
        d, k, p = report["deleted"][cat], report["kept"][cat], report["protected"][cat]
        if cat == "other" and not (d["objects"] or k["objects"] or p["objects"]):
            continue
        _row(table, label, d["objects"], human_bytes(d["bytes"]), k["objects"], p["objects"])
    console.print(table)
    retain = report["retain_checkpoints"]
    console.print(
        f"checkpoints: {verb} {_ids(report['checkpoints_deleted'])}; retained {_ids(report['checkpoints_retained'])}"
        + (f" (--retain {retain})" if retain is not None else ""),
        soft_wrap=True,
    )
    console.print(f"savepoints (never deleted): {', '.join(report['savepoints']) or 'none'}", soft_wrap=True)
    console.print(
        f"total: {verb} {report['objects_deleted']} object(s), {human_bytes(report['bytes_deleted'])}; "
        f"grace period {report['grace_s']:g}s",
        soft_wrap=True,
    )
    for e in report["errors"]:
        console.print(f"ERROR {e}", soft_wrap=True)


def render_savepoint_created(sp: Mapping[str, Any], root: str, *, as_json: bool) -> None:
    if as_json:
        _json(dict(sp))
        return
    console = _console()
    console.print(
        f"savepoint {sp['name']} of checkpoint {sp['checkpoint_id']} created in {root}: {sp['rows']} row(s) "
        f"in {sp['files']} file(s), {human_bytes(sp['bytes'])}", soft_wrap=True,
    )
    console.print(f"restore with job.backend(uid, restore=\"savepoint:{sp['name']}\")", soft_wrap=True)


def render_savepoint_list(rows: Sequence[Mapping[str, Any]], root: str, *, as_json: bool) -> None:
    if as_json:
        _json([dict(r) for r in rows])
        return
    console = _console()
    if not rows:
        console.print(f"no savepoints in {root}")
        return
    table = _table(f"Savepoints in {root}", "name", "checkpoint", "created (UTC)", "operators", "rows", "size",
                   right=("checkpoint", "rows", "size"))
    for r in rows:
        if "error" in r:
            _row(table, r["name"], None, None, f"unreadable: {r['error']}", None, None)
            continue
        ops = ", ".join(f"{uid} (p={p})" for uid, p in r["operators"].items())
        _row(table, r["name"], r["checkpoint_id"], r["created"].replace("T", " ")[:19], ops or NONE,
             r["rows"], human_bytes(r["bytes"]))
    console.print(table)


def render_savepoint_deleted(result: Mapping[str, Any], root: str, *, as_json: bool) -> None:
    if as_json:
        _json(dict(result))
        return
    what = "savepoint" if result["had_metadata"] else "leftovers of unfinished savepoint"
    _console().print(
        f"deleted {what} {result['name']} from {root}: {result['objects_deleted']} object(s), "
        f"{human_bytes(result['bytes_deleted'])}", soft_wrap=True,
    )


def verify_report(report: Mapping[str, Any], *, as_json: bool) -> None:
    if as_json:
        _json(dict(report))
        return
    console = _console()
    summary = (
        f"{report['root']}: {report['checkpoints_checked']} checkpoint(s), "
        f"{len(report.get('savepoints', ()))} savepoint(s), "
        f"{report['segments_checked']} segment(s), "
        f"{report['ranges_checked']} changelog range(s) with {report['records_checked']} record(s), "
        f"{report.get('manifests_checked', 0)} materialization(s) with "
        f"{report.get('table_files_checked', 0)} table file(s); "
        f"{human_bytes(report['bytes_checked'])} checked"
    )
    console.print(summary, soft_wrap=True)
    if report["ok"]:
        console.print("OK: no faults found", soft_wrap=True)
        return
    faults = report["faults"]
    console.print(f"FAILED: {len(faults)} fault(s)", soft_wrap=True)
    for f in faults:
        refs = ", ".join(map(str, f["checkpoints"]))
        where = f" (checkpoints {refs})" if refs else ""
        console.print(f"FAULT {f['object']}{where}: {f['error']}: {f['message']}", soft_wrap=True)
