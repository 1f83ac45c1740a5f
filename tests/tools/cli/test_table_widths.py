"""Tables fit any width: every table-printing command at 40, 80 and 120
columns of a terminal and through a pipe prints every cell value whole: no number split across
lines, nothing ellipsized or cropped, no line wider than the terminal.

The cells are recorded where the commands hand them to ``rich`` (``Table.add_row``), so the
check covers every table of a command, whatever module builds it; the Spark commands' tables
(``sql``, ``inspect`` with counts, ``restore``) are checked in ``tests/tools/cli/test_spark_table_widths.py``
with the same :func:`run_at` and :func:`check_rendering`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from rich.table import Table
from rich.text import Text

import statelog
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from tools.cli import main, output, widths

REPO = Path(__file__).resolve().parents[3]
PIPE = 0  # the width parameter of the pipe case: stdout is not a terminal, COLUMNS is unset
WIDTHS = [40, 80, 120, PIPE]
PIPE_WIDTH = 80  # what a pipe is laid out for (rich's default without COLUMNS)
BOX = "\u2500-\u257f"  # box-drawing characters: the table rules
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")

COUNT = ValueStateDescriptor("count_of_events_per_user_session", pa.int64(), default=0)
EVENTS = ListStateDescriptor("events_seen_in_the_current_window", pa.string())
ATTRS = MapStateDescriptor("attributes_by_name", pa.int64(), key_type=pa.string())


def width_id(width: int) -> str:
    return "pipe" if width == PIPE else f"{width}cols"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three operators with long names and big numbers, runtime statistics, a materialization
    and a savepoint: cells wide enough that 40 and 80 columns cannot show the tables as is."""
    from materializer.build import materialize

    url = (tmp_path_factory.mktemp("widths") / "root").as_uri()
    job = statelog.open(url, max_parallelism=16)
    try:
        backends = {
            uid: [job.backend(uid, subtask=i, parallelism=p) for i in range(p)]
            for uid, p in (("sessionizer_with_a_long_name", 2), ("enrichment", 1), ("per_user_counter", 3))
        }
        for round_ in range(3):
            handles = []
            for uid, bs in backends.items():
                for key_n in range(30):
                    key = f"user-{key_n:05d}"
                    b = bs[statelog.subtask_for_key_group(16, len(bs), statelog.key_group_of(key, 16))]
                    b.set_current_key(key)
                    count = b.get_state(COUNT)
                    count.update(count.value() + 123_456_789)
                    b.get_state(EVENTS).add(f"event number {round_} of {uid}")
                    b.get_state(ATTRS).put("round", 9_876_543_210 + round_)
                handles.extend(b.snapshot(round_ + 1).result(30) for b in bs)
            stats = {
                "duration_ms": 1234.5678, "sync_ms": 12.345, "async_ms": 1987.6, "alignment_ms": 345.25,
                "incremental_bytes": 123_456_789, "inflight_bytes": 98_765_432, "records_per_s": 1_234_567.8,
                "source_records": 9_876_543_210, "attempt": 3, "mode": "exactly_once_unaligned", "final": False,
            }
            sources = {"clicks": {"p0": 123_456_789_012 + round_, "p1": 987_654_321_098}}
            meta = job.publish_checkpoint(round_ + 1, handles, sources, stats)
            if round_ == 1:
                materialize(job.store, meta)
    finally:
        job.close()
    assert main(["savepoint", "create", url, "--checkpoint", "latest", "--name", "before-upgrade-2026"]) == 0
    assert main(["materializer", "run", url, "--once"]) == 0
    return url


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


@pytest.fixture
def cells(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The text of every table cell the command adds (recorded at ``rich``'s ``Table.add_row``)."""
    recorded: list[str] = []
    add_row = Table.add_row

    def recording(self: Table, *renderables: Any, **kwargs: Any) -> None:
        recorded.extend(r.plain if isinstance(r, Text) else str(r) for r in renderables if r is not None)
        add_row(self, *renderables, **kwargs)

    monkeypatch.setattr(Table, "add_row", recording)
    yield recorded


def run_at(width: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           argv: list[str]) -> str:
    """Run the CLI as on a terminal of ``width`` columns (``PIPE``: as into a pipe); its stdout
    without escape sequences."""
    for name in ("COLUMNS", "LINES", "TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    if width != PIPE:
        monkeypatch.setenv("COLUMNS", str(width))
        monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats stdout as a terminal
        monkeypatch.setenv("NO_COLOR", "1")
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return ANSI.sub("", out)


def tokens(text: str) -> Counter[str]:
    """Words as printed: separated by white space and table rules."""
    return Counter(t for t in re.split(rf"[\s{BOX}]+", text) if t)


def printed_tokens(out: str) -> Counter[str]:
    """The printed words, a ``label:`` of the one-record-per-block layout also as ``label``."""
    printed = tokens(out)
    printed.update({t[:-1]: n for t, n in list(printed.items()) if t.endswith(":")})
    return printed


def check_rendering(out: str, cells: list[str], width: int) -> None:
    lines = out.splitlines()
    limit = PIPE_WIDTH if width == PIPE else width
    assert "\u2026" not in out, "a value was ellipsized"
    for line in lines:
        # a pipe keeps free-text lines whole (for grep); tables and every line on a terminal fit
        if width != PIPE or re.search(f"[{BOX}]", line):
            assert len(line) <= limit, f"line of {len(line)} columns at {limit}: {line!r}"
    printed = printed_tokens(out)
    wanted = Counter(t for c in cells for t in tokens(c).elements() if len(t) <= limit - 4)
    missing = {t: n for t, n in wanted.items() if printed[t] < n}
    assert not missing, f"cell words split or lost at {width_id(width)}: {missing}\n{out}"
    numbers = {n for c in cells for n in NUMBER.findall(c)}
    printed_numbers = set(NUMBER.findall(out))
    assert numbers <= printed_numbers, f"numbers split or lost: {numbers - printed_numbers}\n{out}"
    # words longer than a line may be folded, but every character is there, in order
    squeezed = re.sub(rf"[\s{BOX}]+", "", out)
    for c in cells:
        for t in tokens(c):
            if len(t) > limit - 4:
                assert t in squeezed, f"{t!r} lost\n{out}"


@pytest.mark.parametrize("width", WIDTHS, ids=width_id)
@pytest.mark.parametrize("name", list(commands("ROOT")))
def test_every_table_fits(root: str, name: str, width: int, cells: list[str],
                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_at(width, monkeypatch, capsys, commands(root)[name])
    if name != "verify":
        assert cells, "the command printed no table"
    check_rendering(out, cells, width)


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


def test_a_real_pipe_gets_the_pipe_layout(root: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = commands(root)["checkpoints-list"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR")}
    proc = subprocess.run([sys.executable, "-m", "tools.cli", *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_at(PIPE, monkeypatch, capsys, argv)


@pytest.mark.parametrize("width", [80, 90, 100])
def test_checkpoints_list_stays_a_table_at_80_to_100_columns(
    root: str, width: int, cells: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_at(width, monkeypatch, capsys, ["checkpoints", "list", root])
    check_rendering(out, cells, width)
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
