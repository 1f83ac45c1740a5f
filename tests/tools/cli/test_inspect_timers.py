"""``statelog inspect`` shows timer pseudo-states as timers, and leaves unused ones out of its table."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor
from tools.cli import main


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``windows`` registers three event-time timers; ``counter`` registers none."""
    url = (tmp_path_factory.mktemp("timers") / "root").as_uri()
    job = statelog.open(url)
    windows, counter = job.backend("windows"), job.backend("counter")
    for n in range(3):
        windows.set_current_key(f"w{n}")
        windows.get_state(ValueStateDescriptor("sum", pa.int64())).update(n)
        windows.timers.register_event_time_timer(1000 * (n + 1))
        counter.set_current_key(f"k{n}")
        counter.get_state(ValueStateDescriptor("count", pa.int64())).update(n)
    job.checkpoint(sources={})
    job.close()
    return url


def run(capsys: Any, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return code, out


@pytest.mark.parametrize("count", [True, False], ids=["counted", "no-count"])
def test_inspect_json_marks_timer_states(root: str, count: bool, capsys: Any) -> None:
    _, out = run(capsys, "inspect", root, "--json", *(() if count else ("--no-count",)))
    ops = {op["uid"]: {s["name"]: s for s in op["states"]} for op in json.loads(out)["operators"]}
    event = ops["windows"]["__timers_event"]
    assert event["kind"] == "event-time timers" and event["value_type"] == "timestamp (ms)" and event["used"]
    assert event["rows"] == (3 if count else None)
    for uid in ("windows", "counter"):
        assert ops[uid]["__timers_processing"]["kind"] == "processing-time timers"
        assert ops[uid]["__timers_processing"]["used"] is False
    assert ops["counter"]["__timers_event"]["used"] is False
    assert ops["counter"]["count"]["kind"] == "value" and "used" not in ops["counter"]["count"]


@pytest.mark.parametrize("count", [True, False], ids=["counted", "no-count"])
def test_inspect_table_lists_no_unused_timer_state(root: str, count: bool, capsys: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _, out = run(capsys, "inspect", root, *(() if count else ("--no-count",)))
    rows = {line.split("\u2502")[0].strip(): line for line in out.splitlines() if "\u2502" in line}
    assert set(rows) == {"sum", "__timers_event", "count"}, out  # windows: sum, timers; counter: count
    assert "event-time timers" in rows["__timers_event"] and "value" not in rows["__timers_event"]
    assert "no timers (empty views): windows__timers_processing" in out
    assert "no timers (empty views): counter__timers_event, counter__timers_processing" in out
