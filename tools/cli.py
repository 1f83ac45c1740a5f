"""The ``statelog`` command line: inspect, verify and maintain job roots (``docs/cli.md``).

A thin shell over the library: commands compute plain data (dicts, lists, a
:class:`VerifyReport`) and :mod:`tools.output` renders it as ``rich`` tables or JSON
(``--json`` on every command). This module builds the parser, runs ``checkpoints
list|show`` and ``verify``, and takes the other command groups from their modules, each of
which registers its parsers: :mod:`tools.cli_materializer` (``materializer run|status``),
:mod:`tools.cli_maintenance` (``gc``, ``savepoint create|list|delete``),
:mod:`tools.cli_spark` (``sql``, ``inspect``, ``restore``; they need the ``spark`` extra) and
:mod:`tools.cli_ui` (``ui``, the dashboard).
The inspection commands open a root read-only, so a mistyped root is reported, never
created; the maintenance commands write only what they are for.

Exit codes: 0 success, 1 ``verify`` found faults, 2 usage or library error (one line on
stderr, no traceback), 130 interrupted. The console script (and ``python -m tools``) is
:func:`run`: :func:`main`, then :func:`exit_process`.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

import statelog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import (
    CheckpointNotFoundError,
    StatelogError,
)
from tools import cli_maintenance, cli_materializer, cli_spark, cli_ui, output
from tools.roots import (  # noqa: F401 - re-exported for callers and tests
    Root,
    StoreOptionArg,
    load_checkpoint_or_savepoint,
    load_metadata,
    open_root,
    parse_store_options,
    redacted_options,
    resolve_checkpoint_id,
)
from tools.verify import Fault, VerifyReport, verify_root  # noqa: F401

log = logging.getLogger("tools.cli")

EXIT_OK, EXIT_FAULTS, EXIT_ERROR = 0, 1, 2
EXIT_FLUSH_FAILED = 120  # what CPython exits with when stdout or stderr cannot be flushed at exit

# -- checkpoints list / show ---------------------------------------------------------------------


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


def load_checkpoint(root: Root, which: str) -> CheckpointMetadata:
    """A retained checkpoint (an id or ``latest``) or a savepoint (``savepoint:NAME``)."""
    root.require_job()
    return load_checkpoint_or_savepoint(root, which)


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
        type=StoreOptionArg,
        metavar="KEY=VALUE",
        dest="store_option_sub",
        help=option_help,
    )
    parser = argparse.ArgumentParser(
        prog="statelog",
        description="Inspect, verify and maintain statelog job roots.",
        epilog="exit codes: 0 ok, 1 verify found faults, 2 usage or statelog error",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {statelog.__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=verbose_help)
    parser.add_argument(
        "--store-option", action="append", default=[], type=StoreOptionArg, metavar="KEY=VALUE",
        help=option_help,
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

    # command groups in their own modules: register(commands, command) adds their parsers
    cli_materializer.register(commands, command)
    cli_maintenance.register(commands, command)
    cli_spark.register(commands, command)
    cli_ui.register(commands, command)

    command(chk_cmds, "list", cmd_list, "list the retained checkpoints")
    show = command(chk_cmds, "show", cmd_show, "show one checkpoint in detail")
    show.add_argument("checkpoint", metavar="ID", help="checkpoint id, 'latest' or 'savepoint:NAME'")
    verify = command(
        commands,
        "verify",
        cmd_verify,
        "read and check every object the retained checkpoints reference",
    )
    verify.add_argument("--checkpoint", metavar="ID", help="verify only this checkpoint")
    return parser


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


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``: what Python does at exit up to its teardown, then ``os._exit``.

    When this runs, :func:`main` has closed every store, pool, session and server the command
    opened and joined their threads. Here run, as at a normal exit, threading's exit hooks and
    the join of the threads that are not daemons (``threading._shutdown``; multiprocessing
    ends its child processes the same way) and the ``atexit`` callbacks (logging flushes its
    handlers there); then stdout and stderr are flushed (failing that: 120, as CPython). Then
    the process ends without the interpreter's teardown, which races pyarrow: a worker of
    Arrow's CPU pool destroys a Parquet read's task after the read returned, which may release
    the last reference to a buffer of a Python object (the bytes of a table file) and so take
    the GIL; once finalization has begun, taking the GIL ends the thread with ``pthread_exit``,
    whose unwinding through that C++ destructor is ``std::terminate`` ("terminate called
    without an active exception", exit 134) after the command printed its result. pyarrow has
    no Python call that waits for its pools to be idle (Arrow's C++ ``WaitForIdle`` is not
    exposed), so the process cannot wait that out; without the teardown, nothing of the
    interpreter goes away under such a thread.
    """
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # e.g. a closed pipe
            code = EXIT_FLUSH_FAILED
    os._exit(code)


def run() -> NoReturn:
    """The ``statelog`` console script and ``python -m tools``: :func:`main`, then :func:`exit_process`."""
    exit_process(main())


if __name__ == "__main__":
    run()
