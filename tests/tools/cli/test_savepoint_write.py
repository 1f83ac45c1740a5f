"""``statelog savepoint write``: Parquet files of a state's view rows into a new savepoint; bad
input exits 2 with one line on stderr and publishes nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import statelog
from statelog import ValueStateDescriptor
from tools.cli import main


def _args(root: str, name: str, f: Path, *extra: str) -> list[str]:
    return ["savepoint", "write", root, str(f), "--name", name, "--operator", "op", "--state", "count", *extra]


def test_write_then_restore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = (tmp_path / "r").as_uri()
    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"key": ["a", "b"], "value": [1, 2]}), f)
    assert main(_args(root, "s1", f, "--kind", "value", "--value-type", "int64", "--max-parallelism", "16")) == 0
    assert "wrote savepoint 's1'" in capsys.readouterr().out
    with statelog.open(root, create=False) as job:
        b = job.backend("op", restore="savepoint:s1", changelog=False)
        b.get_state(ValueStateDescriptor("count", pa.int64()))
        assert sorted(b.entries("count")) == [("a", None, 1), ("b", None, 2)]


@pytest.mark.parametrize("rows, extra, message", [
    ({"key": ["a", "a"], "value": [1, 2]}, ["--kind", "value", "--value-type", "int64"],
     "operator 'op', state 'count', column 'key': duplicate key 'a'"),
    ({"key": ["a", None], "value": [1, 2]}, ["--kind", "value", "--value-type", "int64"], "column 'key': null key"),
    ({"key": ["a"], "value": [300]}, ["--kind", "value", "--value-type", "int8"], "value 300 does not fit"),
    ({"key": ["a"], "value": [1]}, ["--kind", "set", "--value-type", "int64"], "unknown state kind 'set'"),
    ({"key": ["a"], "value": [1]}, ["--kind", "value", "--value-type", "int6"], "--value-type 'int6' is not an Arrow type"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: dict,
                                        extra: list[str], message: str) -> None:
    root = (tmp_path / "r").as_uri()
    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table(rows), f)
    assert main(_args(root, "s1", f, *extra, "--max-parallelism", "16")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").rglob("*.json"))


def test_existing_name_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = (tmp_path / "r").as_uri()
    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"key": ["a"], "value": [1]}), f)
    ok = ["--kind", "value", "--value-type", "int64", "--max-parallelism", "16"]
    assert main(_args(root, "s1", f, *ok)) == 0
    capsys.readouterr()
    assert main(_args(root, "s1", f, *ok)) == 2
    assert "savepoint 's1' already exists" in capsys.readouterr().err
    assert main(_args(root, "s2", tmp_path / "nope.parquet", *ok)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
