"""Checking that the CLI's tables fit a terminal's width (``tests/tools/cli/test_table_widths.py``,
``tests/tools/cli/test_spark_table_widths.py``): a root whose cells are wide, the cells a command
adds (recorded at ``rich``'s ``Table.add_row``), the CLI run at a width, and the check that
every cell value is printed whole. The fixtures ``widths_root`` and ``table_cells`` are loaded
for every test by ``tests/conftest.py`` (``pytest_plugins``)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from rich.table import Table
from rich.text import Text

import statelog
from materializer.build import materialize
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from tools.cli import main

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


def build_widths_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three operators with long names and big numbers, runtime statistics, a materialization
    and a savepoint: cells wide enough that 40 and 80 columns cannot show the tables as is."""
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


def record_cells(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every table cell the command adds (recorded at ``rich``'s ``Table.add_row``)."""
    recorded: list[str] = []
    add_row = Table.add_row

    def recording(self: Table, *renderables: Any, **kwargs: Any) -> None:
        recorded.extend(r.plain if isinstance(r, Text) else str(r) for r in renderables if r is not None)
        add_row(self, *renderables, **kwargs)

    monkeypatch.setattr(Table, "add_row", recording)
    return recorded


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


@pytest.fixture(scope="module")
def widths_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A root built by :func:`build_widths_root` (once per test module)."""
    return build_widths_root(tmp_path_factory)


@pytest.fixture
def table_cells(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every table cell the command adds (see :func:`record_cells`)."""
    return record_cells(monkeypatch)
