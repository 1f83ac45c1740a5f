"""The commands of ``statelog``: their names, help texts and where their code is.

:func:`tools.cli.build_parser` builds the parser from :data:`COMMANDS` without importing a
command's module: a command names its handler and the function that declares its own
arguments as ``"module:function"`` (:func:`load`), and that module is imported only when the
command runs or its ``--help`` is printed. So ``statelog --help`` and a light command such as
``checkpoints list`` do not load what the other commands need (pyarrow, the materializer,
minio, DuckDB, PySpark, plotly). Every leaf command also takes ``ROOT``, ``--json`` and the
global options (added by :func:`tools.cli.build_parser`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    """A command (``handler`` set) or a group of ``subcommands`` (``handler`` empty)."""

    name: str
    help: str
    handler: str = ""  # "module:function(args, options) -> exit code"
    arguments: str | None = None  # "module:function(parser)" adding the command's own arguments
    description: str | None = None  # a group's description (a command's is its help)
    subcommands: tuple[Command, ...] = ()


def load(spec: str) -> Any:
    """The object ``"module:name"`` names, importing its module."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


_CHK = "tools.cli.checkpoints"
_MAT = "tools.cli.materializer"
_MNT = "tools.cli.maintenance"
_SPK = "tools.cli.spark"

COMMANDS: tuple[Command, ...] = (
    Command("checkpoints", "list and show retained checkpoints", subcommands=(
        Command("list", "list the retained checkpoints", f"{_CHK}:cmd_list"),
        Command("show", "show one checkpoint in detail", f"{_CHK}:cmd_show", f"{_CHK}:declare_show"),
    )),
    Command(
        "materializer",
        "run the materializer daemon, show its status",
        description="Materialize completed checkpoints into Parquet state tables and collect garbage.",
        subcommands=(
            Command("run", "run the materializer daemon on ROOT until SIGTERM/SIGINT (or one cycle with --once)",
                    f"{_MAT}:cmd_run", f"{_MAT}:declare_run"),
            Command("status", "show the lease holder and the newest materialization of ROOT", f"{_MAT}:cmd_status"),
        ),
    ),
    Command(
        "gc",
        "delete checkpoint metadata beyond --retain and every object no retained checkpoint, "
        "savepoint or recent materialization needs (older than --grace)",
        f"{_MNT}:cmd_gc",
        f"{_MNT}:declare_gc",
    ),
    Command(
        "savepoint",
        "create, list and delete savepoints",
        description="Savepoints: self-contained images of a checkpoint that GC never deletes.",
        subcommands=(
            Command("create", "write a savepoint of a retained checkpoint", f"{_MNT}:cmd_savepoint_create",
                    f"{_MNT}:declare_savepoint_create"),
            Command("write", "write a new savepoint with one state from Parquet files of its view's rows",
                    "tools.cli.state_writer:cmd_savepoint_write", "tools.cli.state_writer:declare_savepoint_write"),
            Command("list", "list the savepoints", f"{_MNT}:cmd_savepoint_list"),
            Command("delete", "delete a savepoint (metadata first, then its files)", f"{_MNT}:cmd_savepoint_delete",
                    f"{_MNT}:declare_savepoint_delete"),
        ),
    ),
    Command(
        "sql",
        "run a read-only SQL query over the state of a checkpoint: one view per operator state "
        "(<operator>__<state>), its change feed (<operator>__<state>__changes, with --changes-from) "
        "and statelog_<table> views of the metadata",
        f"{_SPK}:cmd_sql",
        f"{_SPK}:declare_sql",
    ),
    Command("inspect", "summarize a checkpoint's operators and states with their row counts",
            f"{_SPK}:cmd_inspect", f"{_SPK}:declare_inspect"),
    Command("restore", "restore a checkpoint with Spark into a savepoint laid out for a new parallelism",
            f"{_SPK}:cmd_restore", f"{_SPK}:declare_restore"),
    Command(
        "ui",
        "serve a dashboard of the checkpoints, materializations, state sizes, key-group skew and "
        "savepoints (or write it to one HTML file with --out)",
        "tools.cli.ui:cmd_ui",
        "tools.cli.ui:declare_ui",
    ),
    Command(
        "serve",
        "follow ROOT and serve its state over HTTP/JSON (point lookups by key and namespace, the "
        "follower's position); read-only, every request needs the token",
        "tools.cli.serve:cmd_serve",
        "tools.cli.serve:declare_serve",
    ),
    Command("verify", "read and check every object the retained checkpoints reference",
            f"{_MNT}:cmd_verify", f"{_MNT}:declare_verify"),
)
