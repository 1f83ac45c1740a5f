"""The ``statelog`` command line: inspect, verify and maintain job roots (``docs/cli.md``).

A thin shell over the library: commands compute plain data (dicts, lists, a
:class:`VerifyReport`) and :mod:`tools.cli.output` prints it as ``rich`` tables or JSON
(``--json`` on every command). This module builds the parser from the command table of
:mod:`tools.cli.commands` and runs a command; each command group is a module with the
commands' handlers and their arguments: :mod:`tools.cli.checkpoints`
(``checkpoints list|show``), :mod:`tools.cli.materializer` (``materializer run|status``),
:mod:`tools.cli.maintenance` (``gc``, ``savepoint create|list|delete``, ``verify``),
:mod:`tools.cli.spark` (``sql``, ``inspect``, ``restore``; ``--engine spark`` and ``restore``
need the ``spark`` extra) and :mod:`tools.cli.ui` (``ui``, the dashboard). Only the module of
the command that runs is imported (see :mod:`tools.cli.commands`), so ``statelog --help`` and
``checkpoints list`` start without the dependencies of the other commands.
The inspection commands open a root read-only, so a mistyped root is reported, never
created; the maintenance commands write only what they are for.

Exit codes: 0 success, 1 ``verify`` found faults, 2 usage or library error (one line on
stderr, no traceback), 130 interrupted. The console script (and ``python -m tools``,
``python -m tools.cli``) is :func:`run`: :func:`main`, then :func:`exit_process`.
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
from statelog.errors import StatelogError
from tools.cli.commands import COMMANDS, Command, load
from tools.cli.stderr import error, log_to_stderr
from tools.roots import StoreOptionArg, parse_store_options

log = logging.getLogger("tools.cli")

EXIT_ERROR = 2
EXIT_FLUSH_FAILED = 120  # what CPython exits with when stdout or stderr cannot be flushed at exit

# -- command line --------------------------------------------------------------------------------


class CommandParser(argparse.ArgumentParser):
    """A parser whose command adds its own arguments (``arguments``, ``"module:function"``)
    when it is first used: parsed, or its help or usage printed."""

    def __init__(self, *args: Any, arguments: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def declare(self) -> None:
        if self._arguments is not None:
            spec, self._arguments = self._arguments, None
            load(spec)(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.declare()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.declare()
        return super().format_usage()

    def format_help(self) -> str:
        self.declare()
        return super().format_help()


class VersionAction(argparse.Action):
    """``--version``: prints ``statelog VERSION`` and exits; the version is read from the
    package metadata (``importlib.metadata``, some 20 ms) only when the option is given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str = "show program's version number and exit") -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        parser._print_message(f"{parser.prog} {statelog.__version__}\n", sys.stdout)
        parser.exit()


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The ``statelog`` parser. ``lazy``: a command's own arguments are added (and its module
    imported) when that command is parsed or its help printed, as :func:`main` does; else
    every command's arguments are added here (the whole parser, e.g. to document it)."""
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
    parser = CommandParser(
        prog="statelog",
        description="Inspect, verify and maintain statelog job roots.",
        epilog="exit codes: 0 ok, 1 verify found faults, 2 usage or statelog error",
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("-v", "--verbose", action="count", default=0, help=verbose_help)
    parser.add_argument(
        "--store-option", action="append", default=[], type=StoreOptionArg, metavar="KEY=VALUE",
        help=option_help,
    )

    def add(group: Any, cmd: Command) -> None:
        if cmd.subcommands:
            p = group.add_parser(cmd.name, help=cmd.help, description=cmd.description)
            sub = p.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
            for c in cmd.subcommands:
                add(sub, c)
            return
        p = group.add_parser(cmd.name, parents=[common], help=cmd.help, description=cmd.help, arguments=cmd.arguments)
        p.add_argument("root", metavar="ROOT", help="job root: file:///path or s3://bucket/prefix")
        p.add_argument("--json", action="store_true", help="print JSON instead of tables")
        p.set_defaults(handler=cmd.handler)
        if not lazy:
            p.declare()

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        add(commands, cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 verify faults, 2 errors)."""
    try:
        args = build_parser(lazy=True).parse_args(argv)
    except SystemExit as e:  # --help, --version or a usage error (already printed)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    with log_to_stderr(args.verbose + args.verbose_sub):
        try:
            options = parse_store_options([*args.store_option, *args.store_option_sub])
            return int(load(args.handler)(args, options))
        except StatelogError as e:
            error(str(e))
            return EXIT_ERROR
        except KeyboardInterrupt:
            error("interrupted")
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
    """The ``statelog`` console script, ``python -m tools`` and ``python -m tools.cli``:
    :func:`main`, then :func:`exit_process`."""
    exit_process(main())
