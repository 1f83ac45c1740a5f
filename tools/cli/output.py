"""How the CLI prints its results: ``rich`` tables that fit any width, and JSON.

Every command renders its results with these: :func:`_table` and :func:`_row` (tables of
:mod:`tools.cli.widths`, cells as plain text, never ``rich`` markup: values come from the
store), :func:`_console` (standard output) and :func:`_json` (``--json``); :func:`human_bytes`
and :func:`iso_utc` format sizes and times alike everywhere. The error line and ``-v``
logging are :mod:`tools.cli.stderr`'s.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
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
