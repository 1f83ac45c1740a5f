"""How the CLI prints: ``rich`` tables that fit any width, JSON, the error line, logging.

Every command renders its results with these: :func:`_table` and :func:`_row` (tables of
:mod:`tools.cli.widths`, cells as plain text, never ``rich`` markup: values come from the
store), :func:`_console` (standard output), :func:`_json` (``--json``), :func:`error` (the
one line on stderr) and :func:`log_to_stderr` (``-v``); :func:`human_bytes` and
:func:`iso_utc` format sizes and times alike everywhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tools.cli.widths import FitConsole, FitTable

NONE = "-"


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``; plain bytes below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _console() -> Console:
    """Standard output; its ``soft_wrap=True`` lines wrap at words on a terminal (:mod:`tools.cli.widths`)."""
    return FitConsole(file=sys.stdout, highlight=False, markup=False)


def _json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _table(title: str | None, *columns: str, right: Sequence[str] = ()) -> Table:
    """A table that fits any width without cutting a value (:class:`tools.cli.widths.FitTable`)."""
    table = FitTable(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        table.add_column(c, justify="right" if c in right else "left", overflow="fold")
    return table


def _row(table: Table, *cells: Any) -> None:
    table.add_row(*(Text(NONE if c is None else str(c)) for c in cells))


@contextlib.contextmanager
def log_to_stderr(verbosity: int) -> Iterator[None]:
    """Send the log records of statelog, the materializer, the runtime and the tools to stderr.

    The warning per retry of a store call (``statelog.store.retry``) only with ``-v``: without
    it, a store that cannot be reached is the one error line after the last attempt."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(n) for n in ("statelog", "tools", "materializer", "runtime", "statelog.store.retry")]
    saved = [lg.level for lg in loggers]
    logging.getLogger().addHandler(handler)
    for lg in loggers:
        lg.setLevel(level)
    if verbosity <= 0:
        logging.getLogger("statelog.store.retry").setLevel(logging.ERROR)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        for lg, lvl in zip(loggers, saved, strict=True):
            lg.setLevel(lvl)


def error(message: str) -> None:
    """One line on stderr, no traceback."""
    sys.stderr.write(f"statelog: error: {message}\n")
    sys.stderr.flush()
