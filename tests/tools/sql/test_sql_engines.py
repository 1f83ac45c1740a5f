"""``statelog sql`` and ``statelog inspect`` give the same answers on DuckDB (the default) and on
Spark (``--engine spark``): every state kind at several checkpoints (changelog only,
materialized without and with a tail), the change feed and the metadata views, compared as
the command prints them (``--json``); and the Spark engine keeps the CLI's contract for user
errors: exit 2, one line, no traceback, no log4j line unless ``-v``.

In-process runs reuse the test session (``spark`` fixture); the contract on the terminal is
checked in fresh processes, which start their own JVM (its output goes to their stderr).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.spark import jobs
from tools.cli import main

REPO = Path(__file__).resolve().parents[3]


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def both(capsys: Any, b: jobs.Built, query: str, *options: str) -> tuple[list[str], list[Any], list[Any]]:
    """The column names and the rows of ``query`` on each engine (``--json``); rows sorted."""
    results = []
    for engine in ("duckdb", "spark"):
        code, out, err = run(capsys, "sql", b.root, query, "--json", "--max-rows", "100000", "--engine", engine,
                             *options)
        assert code == 0, (engine, query, err)
        rows = json.loads(out)
        results.append(rows)
    columns = [list(rows[0]) if rows else None for rows in results]
    assert columns[0] == columns[1], (query, columns)
    duck, spark = ([_normalized(r) for r in rows] for rows in results)
    return columns[0] or [], sorted(duck, key=_key), sorted(spark, key=_key)


def _key(row: Any) -> str:
    return json.dumps(row, sort_keys=True)


def _canonical(obj: Any) -> Any:
    """``obj`` with sets as sorted lists: a set's order (and so its repr and pickle bytes)
    depends on the string hash seed, which differs between this process (DuckDB) and
    Spark's Python workers."""
    if isinstance(obj, set | frozenset):
        return sorted((_canonical(x) for x in obj), key=repr)
    if isinstance(obj, dict):
        return {repr(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_canonical(x) for x in obj]
    return obj


def _normalized(row: dict[str, Any]) -> dict[str, Any]:
    """A row of a pickled state compares by the unpickled object (its ``value`` column is
    the object's repr)."""
    blob = row.get("value_pickle")
    if isinstance(blob, dict) and "base64" in blob:
        obj = _canonical(pickle.loads(base64.b64decode(blob["base64"])))
        return {**row, "value_pickle": obj, "value": repr(obj)}
    return row


@pytest.mark.parametrize("which", ["c1", "c2", "c3", "c4"])
def test_state_views_are_the_same_on_both_engines(spark: Any, built_file: jobs.Built, capsys: Any,
                                                   which: str) -> None:
    """c1 changelog only, c2 materialized without a tail, c3 and c4 with a tail (c4: deletes)."""
    cid = str(getattr(built_file, which))
    states = jobs.STATES if which != "c2" else ["count", "attrs", "avg", "blob", "ttl_l", "__timers_event"]
    for state in states:
        columns, duck, sparks = both(capsys, built_file, f"SELECT * FROM op__{state.lstrip('_')}",
                                     "--checkpoint", cid)
        assert duck == sparks, (which, state)
        assert duck, (which, state, "no rows")
        assert columns[:5] == ["key_group", "key", "key_bytes", "namespace", "namespace_bytes"]


def test_key_type_and_expressions_are_the_same(spark: Any, built_file: jobs.Built, capsys: Any) -> None:
    b = built_file
    _, duck, sparks = both(capsys, b, "SELECT key, value FROM words__n", "--key-type", "string")
    assert duck == sparks and len(duck) == 12
    q = ("SELECT key, cardinality(value) AS n, value['p'] AS p FROM op__attrs "
         "WHERE namespace IS NULL ORDER BY key")
    _, duck, sparks = both(capsys, b, q, "--checkpoint", str(b.c3))
    assert duck == sparks and duck
    q = "SELECT namespace, count(*) AS n, sum(value) AS total FROM op__count GROUP BY namespace"
    _, duck, sparks = both(capsys, b, q, "--checkpoint", str(b.c4))
    assert duck == sparks and len(duck) == 3


def test_change_feed_views_are_the_same(spark: Any, built_file: jobs.Built, capsys: Any) -> None:
    b = built_file
    for state in ("count", "seen", "attrs", "avg", "blob", "ttl_m", "pmap", "__timers_event"):
        columns, duck, sparks = both(capsys, b, f"SELECT * FROM op__{state.lstrip('_')}__changes",
                                     "--changes-from", str(b.c1), "--checkpoint", str(b.c4))
        assert duck == sparks and duck, state
        assert columns[:5] == ["checkpoint_id", "stream", "seq", "replay_order", "op"]


@pytest.mark.parametrize("table", ["checkpoints", "operators", "states", "subtasks", "materializations", "files"])
def test_metadata_views_are_the_same(spark: Any, built_file: jobs.Built, capsys: Any, table: str) -> None:
    columns, duck, sparks = both(capsys, built_file, f"SELECT * FROM statelog_{table}")
    assert duck == sparks and duck, table
    if table == "checkpoints":
        assert duck[0]["timestamp"].endswith("+00:00")  # both engines print timestamps in UTC


def test_inspect_is_the_same(spark: Any, built_file: jobs.Built, capsys: Any) -> None:
    reports = []
    for engine in ("duckdb", "spark"):
        code, out, err = run(capsys, "inspect", built_file.root, "--checkpoint", str(built_file.c3), "--json",
                             "--engine", engine)
        assert code == 0, err
        reports.append(json.loads(out))
    assert reports[0] == reports[1]
    assert all(s["rows"] is not None for op in reports[0]["operators"] for s in op["states"])


# -- the Spark engine's user errors ----------------------------------------------------------------

SPARK_ERRORS = [
    ("unknown view", ["SELECT * FROM nope"], "no view 'nope' in checkpoint"),
    ("insert", ["INSERT INTO op__count VALUES (1)"], "starts with 'INSERT'"),
    ("drop", ["DROP VIEW op__count"], "starts with 'DROP'"),
    ("create", ["CREATE TABLE t AS SELECT 1"], "starts with 'CREATE'"),
    ("syntax", ["SELECT * FROM op__count WHERE key ="], "PARSE_SYNTAX_ERROR"),
    ("key type mismatch", ["SELECT * FROM op__count", "--key-type", "int64"], "the declared key type is int64"),
    ("unknown column", ["SELECT nope FROM op__count"], "nope"),
    ("bad master", ["SELECT 1", "--master", "bogus"], "--master"),
    ("change view without --changes-from", ["SELECT * FROM op__count__changes"], "need --changes-from ID"),
]


@pytest.mark.parametrize(("case", "argv", "fragment"), SPARK_ERRORS, ids=[c for c, *_ in SPARK_ERRORS])
def test_spark_user_errors_exit_2_with_one_line(spark: Any, built_file: jobs.Built, capsys: Any, case: str,
                                                argv: list[str], fragment: str) -> None:
    code, out, err = run(capsys, "sql", built_file.root, *argv, "--engine", "spark")
    lines = err.strip().splitlines()
    assert code == 2, (case, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("statelog: error: ") and fragment in lines[0], lines[0]
    assert out == ""


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STATELOG_SPARK_MASTER"}
    return subprocess.run([sys.executable, "-m", "tools", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_spark_engine_on_the_terminal_prints_no_jvm_output(built_file: jobs.Built) -> None:
    """Fresh processes with their own JVM: an error raised inside Spark (a key that does not
    fit, raised in a Python worker) is one line; a success prints nothing on stderr;
    with ``-v`` Spark's own log lines show."""
    root = built_file.root
    cases = {
        "ok": ["sql", root, "SELECT count(*) AS n FROM op__count", "--engine", "spark", "--master", "local[1]",
               "--json"],
        "key type": ["sql", root, "SELECT * FROM op__count", "--engine", "spark", "--master", "local[1]",
                     "--key-type", "int64"],
        "verbose": ["-v", "sql", root, "SELECT 1 AS one", "--engine", "spark", "--master", "local[1]"],
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(lambda argv: _cli(*argv), cases.values()), strict=True))
    ok = results["ok"]
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert json.loads(ok.stdout)[0]["n"] > 0
    r = results["key type"]  # (a SQL syntax error: in-process above, same code path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("statelog: error: ") and "Traceback" not in r.stderr, r.stderr
    assert "the declared key type is int64" in results["key type"].stderr
    verbose = results["verbose"]
    assert verbose.returncode == 0, verbose.stderr
    assert any(" INFO " in line or " WARN " in line for line in verbose.stderr.splitlines()), verbose.stderr
