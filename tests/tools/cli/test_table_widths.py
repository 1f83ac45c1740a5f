"""Tables fit any width: every table-printing command at 40, 80 and 120
columns of a terminal and through a pipe prints every cell value whole: no number split across
lines, nothing ellipsized or cropped, no line wider than the terminal.

The cells are recorded where the commands hand them to ``rich`` (``Table.add_row``), so the
check covers every table of a command, whatever module builds it; the Spark commands' tables
(``sql``, ``inspect`` with counts, ``restore``) are checked in ``tests/tools/cli/test_spark_table_widths.py``
with the same :func:`~tests.support.table_widths.run_at` and
:func:`~tests.support.table_widths.check_rendering`; the fixtures ``widths_root`` and
``table_cells`` are there too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.table_widths import (
    BOX,
    PIPE,
    WIDTHS,
    check_rendering,
    run_at,
    width_id,
)
from tools.cli import output, widths

REPO = Path(__file__).resolve().parents[3]


def commands(root: str) -> dict[str, list[str]]:
    return {
        "checkpoints-list": ["checkpoints", "list", root],
        "checkpoints-show": ["checkpoints", "show", root, "latest"],
        "checkpoints-show-savepoint": ["checkpoints", "show", root, "savepoint:before-upgrade-2026"],
        "savepoint-list": ["savepoint", "list", root],
        "gc": ["gc", root, "--dry-run", "--grace", "0s"],
        "materializer-status": ["materializer", "status", root],
        "inspect-no-count": ["inspect", root, "--no-count"],
        "verify": ["verify", root],
    }


@pytest.mark.parametrize("width", WIDTHS, ids=width_id)
@pytest.mark.parametrize("name", list(commands("ROOT")))
def test_every_table_fits(widths_root: str, name: str, width: int, table_cells: list[str],
                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_at(width, monkeypatch, capsys, commands(widths_root)[name])
    if name != "verify":
        assert table_cells, "the command printed no table"
    check_rendering(out, table_cells, width)


@pytest.mark.parametrize("width", [24, 40, 80])
def test_a_table_too_wide_for_the_terminal_becomes_one_record_per_block(
    width: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    table = output._table("Wide", *(f"column {i}" for i in range(12)), right=("column 1",))
    values = [[f"{r}-{i}" * 3 + " 1234567.5 KiB" for i in range(12)] for r in range(2)]
    for row in values:
        output._row(table, *row)
    output._console().print(table)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "Wide"
    assert all(len(line) <= width for line in lines), out
    assert not re.search(f"[{BOX}]", out)
    for row in values:  # "column i: value", the value whole (it fits in a line here)
        for i, value in enumerate(row):
            assert re.search(rf"^column {i}:\s+{re.escape(value)}$", out, re.M) or width < 40, out
    assert "1234567.5 KiB" in out and out.count("1234567.5 KiB") == 24
    assert out.count("\n\n") >= 1  # records are separated by a blank line


def test_wrapping_keeps_a_number_with_its_unit() -> None:
    line = "sync 1.2 ms, async 8.0 ms, 12.0 KiB"
    assert [line[a:b] for a, b in widths.wrap_spans(line, 10)] == ["sync", "1.2 ms,", "async", "8.0 ms,", "12.0 KiB"]
    assert [line[a:b] for a, b in widths.wrap_spans(line, 12)] == ["sync 1.2 ms,", "async", "8.0 ms,", "12.0 KiB"]
    assert ["abcdefghij"[a:b] for a, b in widths.wrap_spans("abcdefghij", 4)] == ["abcd", "efgh", "ij"]


def test_a_real_pipe_gets_the_pipe_layout(widths_root: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = commands(widths_root)["checkpoints-list"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR")}
    proc = subprocess.run([sys.executable, "-m", "tools.cli", *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_at(PIPE, monkeypatch, capsys, argv)


@pytest.mark.parametrize("width", [80, 90, 100])
def test_checkpoints_list_stays_a_table_at_80_to_100_columns(
    widths_root: str, width: int, table_cells: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_at(width, monkeypatch, capsys, ["checkpoints", "list", widths_root])
    check_rendering(out, table_cells, width)
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), out
    header = next(line for line in lines if "\u2503" in line)  # the heavy rule between the headers
    assert [h.strip() for h in header.split("\u2503")] == ["id", "time (UTC)", "kind", "changelog", "materialized",
                                                           "stats"]
    rows = [line.split("\u2502")[0].strip() for line in lines if "\u2502" in line]
    assert [r for r in rows if r] == ["1", "2", "3"], out  # one table row per checkpoint
    # the operators and states are listed whole below the table, once for the three checkpoints
    assert "operators of checkpoints 1, 2, 3:" in out
    for uid in ("sessionizer_with_a_long_name", "enrichment", "per_user_counter"):
        assert out.count(uid) == 1, out
