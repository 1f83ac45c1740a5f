"""``statelog sql``, ``statelog inspect`` and ``statelog restore`` (they reuse the test session)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import ListStateDescriptor, ValueStateDescriptor
from tools.cli import main
from tools.sql.views import view_names


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Operator ``counter`` (p=2): ``count`` and ``seen``; two checkpoints."""
    root = (tmp_path_factory.mktemp("cli") / "root").as_uri()
    job = statelog.open(root, max_parallelism=8)
    bs = [job.backend("counter", subtask=i, parallelism=2) for i in range(2)]
    sts = [(b.get_state(ValueStateDescriptor("count", pa.int64())), b.get_state(ListStateDescriptor("seen", pa.string())))
           for b in bs]
    for n in range(20):
        key = f"k{n % 6}"
        i = statelog.subtask_for_key_group(8, 2, statelog.key_group_of(key, 8))
        bs[i].set_current_key(key)
        sts[i][0].update(n)
        sts[i][1].add(f"e{n}")
    job.checkpoint(sources={"offset": 20})
    job.checkpoint(sources={"offset": 20})
    job.close()
    return root


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sql_json_and_table(spark: Any, small: str, capsys: Any) -> None:
    code, out, err = run(capsys, "sql", small, "SELECT key, value FROM counter__count ORDER BY key", "--json")
    assert code == 0, err
    assert json.loads(out) == [{"key": f"k{i}", "value": 18 + i - (6 if i >= 2 else 0)} for i in range(6)]
    code, out, err = run(capsys, "sql", small, "SELECT key, size(value) AS n FROM counter__seen WHERE key = 'k0'",
                         "--key-type", "string", "--checkpoint", "1", "--engine", "spark")  # size(): Spark SQL
    assert code == 0, err
    assert "k0" in out and "4" in out and "1 row(s)" in out
    code, out, err = run(capsys, "sql", small, "SELECT checkpoint_id FROM statelog_checkpoints", "--json")
    assert code == 0 and [r["checkpoint_id"] for r in json.loads(out)] == [1, 2]


def test_sql_errors(spark: Any, small: str, capsys: Any) -> None:
    code, _, err = run(capsys, "sql", small, "SELECT * FROM counter__count", "--checkpoint", "99")
    assert code == 2 and "checkpoint 99 does not exist" in err and "Traceback" not in err
    code, _, err = run(capsys, "sql", small, "SELECT * FROM counter__count", "--key-type", "int64")
    assert code == 2 and 'the declared key type is int64, but the state holds key' in err
    code, _, err = run(capsys, "sql", small, "SELECT * FROM nope", "--engine", "spark")
    assert code == 2 and "no view 'nope' in checkpoint 2" in err and "Traceback" not in err


def test_inspect(spark: Any, small: str, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run(capsys, "inspect", small, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["checkpoint_id"] == 2 and report["sources"] == {"offset": 20}
    (op,) = report["operators"]
    states = {s["name"]: s for s in op["states"]}
    assert states["count"]["rows"] == 6 and states["seen"]["rows"] == 6
    assert states["count"]["view"] == "counter__count" and states["__timers_event"]["internal"]
    code, out, err = run(capsys, "inspect", small, "--no-count")
    assert code == 0 and "counter__seen" in out


def test_restore_command(spark: Any, small: str, capsys: Any) -> None:
    code, out, err = run(capsys, "restore", small, "--checkpoint", "1", "--parallelism", "3", "--savepoint", "three",
                         "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["savepoint"] == "three" and data["operators"]["counter"]["parallelism"] == 3
    assert data["rows"] == 12 and data["restore"] == "savepoint:three"
    code, out, err = run(capsys, "sql", small, "SELECT count(*) AS n FROM counter__count", "--checkpoint",
                         "savepoint:three", "--json")
    assert code == 0 and json.loads(out) == [{"n": 6}]
    # rescale the savepoint itself
    code, out, err = run(capsys, "restore", small, "--checkpoint", "savepoint:three", "--parallelism", "1",
                         "--savepoint", "one", "--json")
    assert code == 0, err
    assert json.loads(out)["source"] == "savepoint 'three' (of checkpoint 1)" and json.loads(out)["rows"] == 12
    job = statelog.open(small, create=False)
    try:
        b = job.backend("counter", restore="savepoint:one", changelog=False)
        count = b.get_state(ValueStateDescriptor("count", pa.int64()))
        b.set_current_key("k1")
        assert count.value() == 19
    finally:
        job.close()
    code, _, err = run(capsys, "restore", small, "--checkpoint", "1", "--parallelism", "9")
    assert code == 2 and "parallelism 9 is outside 1..8" in err
    code, _, err = run(capsys, "restore", small, "--checkpoint", "1", "--drop-operator", "x")
    assert code == 2 and "operator 'x' does not exist" in err
    code, _, err = run(capsys, "restore", small, "--checkpoint", "1", "--rename-operator", "counter")
    assert code == 2 and "not of the form OLD=NEW" in err


def test_view_names_are_sanitized_and_unique() -> None:
    class Op:
        def __init__(self, states: list[str]) -> None:
            self.states = dict.fromkeys(states)

    class Meta:
        operators = {"a-b": Op(["x", "__timers_event"]), "a_b": Op(["x"])}

    assert view_names(Meta()) == {
        "a_b__timers_event": ("a-b", "__timers_event"),
        "a_b__x": ("a-b", "x"),
        "a_b__x_2": ("a_b", "x"),
    }
