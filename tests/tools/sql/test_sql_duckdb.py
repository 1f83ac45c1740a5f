"""``statelog sql`` and ``statelog inspect`` on DuckDB (the default engine, tools/sql/duckdb.py).

The job of :mod:`tests.support.spark.jobs` (every state kind; checkpoints c1: changelog only, c2:
materialized without tail, c3: materialized plus a tail, c4: a longer tail with deletes):
every state view at every checkpoint equals a backend restore, the change feed applied to
the state at A gives the state at B, the metadata views hold the root's metadata, a
savepoint reads like its checkpoint; each user error exits 2 with one line, no traceback.
No Spark session is started here (tests/tools/sql/test_sql_engines.py compares with Spark).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from materializer.savepoint import create_savepoint
from statelog.keys.encoding import decode_key
from statelog.readers.restore import stream_state
from statelog.readers.state import state_schema
from tests.support.s3server import RootSpec
from tests.support.spark import jobs
from tests.support.spark.reading import apply_feed, state_at
from tools.cli import main
from tools.sql.duckdb import ArrowViews, connect, run_query
from tools.sql.views import check_read_only, plan_views, referenced


class Row(dict):
    """A DuckDB row as a mapping with ``asDict()`` (the helpers of tests/statelog/spark take Spark rows)."""

    def asDict(self) -> dict[str, Any]:  # noqa: N802 - Spark's name
        return dict(self)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> jobs.Built:
    b = jobs.build((tmp_path_factory.mktemp("duck") / "root").as_uri(), {})
    job = statelog.open(b.root, create=False)
    try:
        create_savepoint(job.store, b.c3, "before")
    finally:
        job.close()
    return b


def duck(b: jobs.Built, query: str, checkpoint: Any = "latest", changes_from: Any = None,
         key_type: str | None = None, max_rows: int = 100_000) -> tuple[list[str], list[Row]]:
    """Columns and rows of ``query`` on the DuckDB engine, as the CLI runs it."""
    check_read_only(query)
    plan = plan_views(b.root, b.options, str(checkpoint), None if changes_from is None else str(changes_from))
    cols, rows = run_query(plan, b.options, key_type, query, referenced(query, plan.names), max_rows)
    return cols, [Row(zip(cols, r, strict=True)) for r in rows]


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def view(state: str) -> str:
    return "op__" + state.lstrip("_")


# -- state views ---------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["c1", "c2", "c3", "c4"])
def test_state_views_equal_a_backend_restore(built: jobs.Built, which: str) -> None:
    """c1 changelog only, c2 a materialization without tail, c3/c4 with a tail (deletes in c4)."""
    cid = getattr(built, which)
    job = statelog.open(built.root, create=False)
    try:
        meta = job.load_checkpoint(cid)
        hs = meta.operators["op"].subtasks
        premise = {"c1": (False, True), "c2": (True, False), "c3": (True, True), "c4": (True, True)}[which]
        assert (any(h.materialization for h in hs), any(h.changelog for h in hs)) == premise
        for state in jobs.STATES:
            cols, rows = duck(built, f"SELECT * FROM {view(state)}", cid)
            info = meta.operators["op"].states[state]
            assert cols == state_schema(info, None).names, state
            got = {_triple(r, state) for r in rows}
            assert len(got) == len(rows), (which, state, "duplicate rows")
            assert got == jobs.restored_rows(job, cid, state), (which, state)
            if state.startswith("ttl_"):
                want = {kb: exp for (s, kb), exp in built.expiry[cid].items() if s == state}
                assert {bytes(r["key_bytes"]): r["expires_ms"] for r in rows} == want, (which, state)
            elif not state.startswith("__"):
                assert all(r["expires_ms"] is None for r in rows), state
            for r in rows:
                key = decode_key(bytes(r["key_bytes"]))
                assert r["key_group"] == statelog.key_group_of(key, jobs.MAXP)
                assert r["key"] == (None if key is None else key if type(key) is str else repr(key))
    finally:
        job.close()


def _triple(r: Row, state: str) -> tuple:
    if state.startswith("__timers"):
        value: Any = r["timestamp"]
    elif "value_pickle" in r:
        value = jobs.norm(pickle.loads(r["value_pickle"]))
    else:
        value = jobs.norm(r["value"])
    return bytes(r["key_bytes"]), bytes(r["namespace_bytes"]), value


def test_column_types_are_the_data_sources_in_duckdb_terms(built: jobs.Built) -> None:
    """The Arrow form of the data source's Spark schema, as DuckDB names it (docs/cli.md)."""
    types = {}
    for state in ("count", "seen", "attrs", "avg", "blob", "ttl_l", "ttl_m", "pmap", "__timers_event"):
        _, rows = duck(built, f"DESCRIBE {view(state)}", built.c3)
        types[state] = {r["column_name"]: r["column_type"] for r in rows}
    key = {"key_group": "INTEGER", "key": "VARCHAR", "key_bytes": "BLOB", "namespace": "VARCHAR",
           "namespace_bytes": "BLOB"}
    assert types["count"] == {**key, "value": "BIGINT", "expires_ms": "BIGINT"}
    assert types["seen"] == {**key, "value": "VARCHAR[]", "expires_ms": "BIGINT[]"}
    assert types["attrs"] == {**key, "value": "MAP(VARCHAR, BIGINT)", "expires_ms": "MAP(VARCHAR, BIGINT)"}
    assert types["avg"] == {**key, "value": "STRUCT(sum BIGINT, count BIGINT)", "expires_ms": "BIGINT"}
    assert types["blob"] == {**key, "value": "VARCHAR", "value_pickle": "BLOB", "expires_ms": "BIGINT"}
    assert types["ttl_l"] == {**key, "value": "BIGINT[]", "expires_ms": "BIGINT[]"}
    assert types["ttl_m"] == {**key, "value": "MAP(VARCHAR, VARCHAR)", "value_pickle": "BLOB",
                              "expires_ms": "MAP(VARCHAR, BIGINT)"}
    assert types["pmap"]["value"] == "MAP(VARCHAR, VARCHAR)"
    assert types["__timers_event"] == {**key, "timestamp": "BIGINT"}


def test_key_type_and_namespaces(built: jobs.Built) -> None:
    cols, rows = duck(built, "SELECT key, value FROM words__n ORDER BY key", built.c4, key_type="string")
    assert cols == ["key", "value"] and rows[0] == {"key": "w0", "value": 999} and len(rows) == 12
    _, typed = duck(built, "SELECT typeof(key) AS t FROM words__n LIMIT 1", built.c4, key_type="string")
    assert typed == [{"t": "VARCHAR"}]
    _, rows = duck(built, "SELECT DISTINCT namespace FROM op__seen ORDER BY namespace NULLS FIRST", built.c4)
    assert [r["namespace"] for r in rows] == [None, "(0, 1000)", "(1000, 2000)"]


def test_savepoint_reads_like_its_checkpoint(built: jobs.Built) -> None:
    q = "SELECT key_bytes, namespace_bytes, value FROM op__count ORDER BY 1, 2"
    assert duck(built, q, "savepoint:before")[1] == duck(built, q, built.c3)[1]
    _, rows = duck(built, "SELECT checkpoint_id, kind, savepoint FROM statelog_checkpoints ORDER BY kind, 1")
    assert [tuple(r.values()) for r in rows] == [
        *((c, "checkpoint", None) for c in (built.c1, built.c2, built.c3, built.c4)),
        (built.c3, "savepoint", "before"),
    ]


def test_latest_and_max_rows(built: jobs.Built, capsys: Any) -> None:
    code, out, err = run(capsys, "sql", built.root, "SELECT count(*) AS n FROM op__count", "--json")
    assert code == 0, err
    job = statelog.open(built.root, create=False)
    try:
        assert json.loads(out) == [{"n": len(jobs.restored_rows(job, built.c4, "count"))}]
    finally:
        job.close()
    code, out, err = run(capsys, "sql", built.root, "SELECT key FROM op__count", "--max-rows", "3")
    assert code == 0 and out.rstrip().endswith("3 row(s) (first 3; use --max-rows)")


# -- the change feed -----------------------------------------------------------------------------


def test_change_feed_applied_to_a_gives_b(built: jobs.Built) -> None:
    job = statelog.open(built.root, create=False)
    try:
        c3 = job.load_checkpoint(built.c3).operators["op"]
        ends = {r.stream: r.end for h in c3.subtasks for r in h.changelog}
        for a in (built.c1, built.c3):
            for state in jobs.STATES:
                cols, rows = duck(built, f"SELECT * FROM {view(state)}__changes", built.c4, changes_from=a)
                assert cols[:6] == ["checkpoint_id", "stream", "seq", "replay_order", "op", "key_group"]
                assert rows, (a, state, "no changes")
                before, after = state_at(job, a, state), state_at(job, built.c4, state)
                assert jobs.norm(apply_feed(before, rows, state)) == jobs.norm(after), (a, state)
                for r in rows:
                    assert stream_state(r["stream"]) == state
                    if a == built.c1:
                        assert r["checkpoint_id"] == (built.c3 if r["seq"] < ends.get(r["stream"], 0) else built.c4)
    finally:
        job.close()


def test_change_feed_of_a_checkpoint_to_itself_is_empty(built: jobs.Built) -> None:
    assert duck(built, "SELECT * FROM op__count__changes", built.c3, changes_from=built.c3)[1] == []


# -- metadata views ------------------------------------------------------------------------------


def test_metadata_views(built: jobs.Built) -> None:
    b = built
    _, checkpoints = duck(b, "SELECT * FROM statelog_checkpoints WHERE kind = 'checkpoint' ORDER BY checkpoint_id")
    assert [r["checkpoint_id"] for r in checkpoints] == [b.c1, b.c2, b.c3, b.c4]
    first = checkpoints[0]
    assert first["max_parallelism"] == jobs.MAXP and first["operators"] == ["op", "words"]
    assert first["materializations"] == [] and checkpoints[2]["materializations"] == [b.m1]
    assert first["timestamp"].tzinfo is not None and json.loads(first["sources"]) == {"offset": 1}
    _, states = duck(b, f"SELECT * FROM statelog_states WHERE checkpoint_id = {b.c3} AND state = 'ttl_m'"
                        " AND kind = 'checkpoint'")
    (ttl,) = states
    assert (ttl["state_kind"], ttl["value_type"], ttl["user_key_type"], ttl["ttl_ms"]) == \
        ("map", "pickle", "string", jobs.TTL_MS)
    _, subtasks = duck(b, f"SELECT key_group_start, key_group_end, materialization FROM statelog_subtasks "
                          f"WHERE checkpoint_id = {b.c3} AND operator = 'op' AND kind = 'checkpoint' ORDER BY 1")
    assert [(r["key_group_start"], r["key_group_end"]) for r in subtasks] == [(0, 7), (8, 15)]
    assert subtasks[0]["materialization"][0]["manifest"] == b.m1
    _, mats = duck(b, f"SELECT checkpoint_id, referenced_by, rows FROM statelog_materializations "
                      f"WHERE manifest = '{b.m1}'")
    assert mats[0]["checkpoint_id"] == b.c1 and mats[0]["referenced_by"] == [b.c2, b.c3, b.c4]
    _, files = duck(b, f"SELECT sum(rows) AS n FROM statelog_files WHERE manifest = '{b.m1}'")
    assert files[0]["n"] == mats[0]["rows"]
    _, ops = duck(b, f"SELECT * FROM statelog_operators WHERE checkpoint_id = {b.c3} AND operator = 'op' "
                     "AND kind = 'checkpoint'")
    assert ops[0]["parallelism"] == 2 and set(ops[0]["states"]) == {d.name for d in jobs.DESCRIPTORS}


# -- inspect -------------------------------------------------------------------------------------


def test_inspect_counts_rows_with_duckdb(built: jobs.Built, capsys: Any) -> None:
    code, out, err = run(capsys, "inspect", built.root, "--checkpoint", str(built.c3), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["checkpoint_id"] == built.c3
    (op,) = [o for o in report["operators"] if o["uid"] == "op"]
    job = statelog.open(built.root, create=False)
    try:
        for s in op["states"]:
            # jobs.restored_rows reads event timers; the job sets no processing-time timer
            want = 0 if s["name"] == "__timers_processing" else len(jobs.restored_rows(job, built.c3, s["name"]))
            assert s["rows"] == want, s["name"]
            assert s["view"] == view(s["name"])
    finally:
        job.close()
    code, out, err = run(capsys, "inspect", built.root, "--checkpoint", "savepoint:before", "--json")
    assert code == 0, err
    assert json.loads(out)["savepoint"] == "before"


# -- read-only -----------------------------------------------------------------------------------


def test_the_connection_reads_only_the_registered_views(built: jobs.Built, tmp_path: Path) -> None:
    """Even a statement past the checks could not touch a file: DuckDB's file access is off."""
    plan = plan_views(built.root, {}, "latest")
    with ArrowViews(plan, {}, None) as views:
        con = connect(views, ["op__count"])
    target = tmp_path / "out.csv"
    try:
        for statement in (f"COPY op__count TO '{target}'", f"ATTACH '{tmp_path / 'x.db'}'",
                          "SELECT * FROM read_csv('/etc/hostname')", "SET enable_external_access = true"):
            with pytest.raises(duckdb.Error):
                con.execute(statement)
        assert con.execute("SELECT count(*) FROM op__count").fetchone()[0] > 0
    finally:
        con.close()
    assert not target.exists() and not (tmp_path / "x.db").exists()


# -- user errors ---------------------------------------------------------------------------------

ERRORS = [
    # (case, argv after ROOT, a fragment of the error line)
    ("unknown view", ["SELECT * FROM nope"], "no view 'nope' in checkpoint"),
    ("change view without --changes-from", ["SELECT * FROM op__count__changes"], "need --changes-from ID"),
    ("insert", ["INSERT INTO op__count VALUES (1)"], "starts with 'INSERT'"),
    ("create", ["CREATE TABLE x AS SELECT 1"], "starts with 'CREATE'"),
    ("drop", ["DROP VIEW op__count"], "starts with 'DROP'"),
    ("copy", ["COPY op__count TO '/tmp/statelog-copy.csv'"], "starts with 'COPY'"),
    ("set", ["SET threads = 1"], "starts with 'SET'"),
    ("attach", ["ATTACH 'x.db'"], "starts with 'ATTACH'"),
    ("insert after a CTE", ["WITH a AS (SELECT 1) INSERT INTO op__count SELECT * FROM a"], "INSERT statement"),
    ("explain analyze of a copy", ["EXPLAIN ANALYZE COPY op__count TO 'x.csv'"], "COPY statement"),
    ("two statements", ["SELECT 1; SELECT 2"], "runs one statement, the query holds 2"),
    ("read a file", ["SELECT * FROM read_csv('/etc/hostname')"], "file system operations are disabled"),
    ("syntax: keyword", ["SELEC 1"], "starts with 'SELEC'"),
    ("syntax: parser", ["SELECT * FROM op__count WHERE"], 'Parser Error: syntax error at or near "WHERE"'),
    ("unknown column", ["SELECT nope FROM op__count"], 'Referenced column "nope" not found'),
    ("conversion", ["SELECT CAST('x' AS INT)"], "Conversion Error"),
    ("key type mismatch", ["SELECT * FROM op__count", "--key-type", "int64"], "the declared key type is int64"),
    ("unknown key type", ["SELECT 1", "--key-type", "nonsense"], "unknown Arrow type name 'nonsense'"),
    ("unknown checkpoint", ["SELECT 1", "--checkpoint", "99"], "checkpoint 99 does not exist"),
    ("unknown --changes-from", ["SELECT 1", "--changes-from", "99"], "checkpoint 99 does not exist"),
    ("feed to a savepoint", ["SELECT * FROM op__count__changes", "--checkpoint", "savepoint:before",
                             "--changes-from", "1"], "changesTo must be a checkpoint"),
    ("unknown savepoint", ["SELECT 1", "--checkpoint", "savepoint:nope"], "nope"),
    ("--master with duckdb", ["SELECT 1", "--engine", "duckdb", "--master", "local[1]"], "--master"),
]


@pytest.mark.parametrize(("case", "argv", "fragment"), ERRORS, ids=[c for c, *_ in ERRORS])
def test_user_errors_exit_2_with_one_line(built: jobs.Built, capsys: Any, case: str, argv: list[str],
                                          fragment: str) -> None:
    code, out, err = run(capsys, "sql", built.root, *argv)
    lines = err.strip().splitlines()
    assert code == 2, (case, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]
    assert out == ""


def test_an_unknown_engine_is_a_usage_error(built: jobs.Built, capsys: Any) -> None:
    """argparse's usage errors (every command's) print the usage, then the one error line."""
    code, _, err = run(capsys, "sql", built.root, "SELECT 1", "--engine", "postgres")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("statelog sql: error: argument --engine: invalid choice")


def test_not_a_job_root_and_inspect_errors(tmp_path: Path, capsys: Any, built: jobs.Built) -> None:
    for argv in (["sql", tmp_path.as_uri(), "SELECT 1"], ["inspect", tmp_path.as_uri()],
                 ["inspect", built.root, "--checkpoint", "99"], ["inspect", built.root, "--master", "x",
                                                                 "--engine", "duckdb"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)


def test_state_without_rows_is_an_empty_view(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    job = statelog.open(root, max_parallelism=8)
    b = job.backend("op")
    b.get_state(statelog.ValueStateDescriptor("v", pa.int64()))
    job.checkpoint(sources={})
    job.close()
    cols, rows = duck(jobs.Built(root, {}), "SELECT * FROM op__v")
    assert rows == [] and cols == ["key_group", "key", "key_bytes", "namespace", "namespace_bytes", "value",
                                   "expires_ms"]


@pytest.mark.s3
def test_an_s3_root_with_store_options(s3_root: RootSpec, capsys: Any) -> None:
    """State rows (a materialization plus a tail) and the change feed read through the store
    options; the secret appears in no output, also not in an error line."""
    count = statelog.ValueStateDescriptor("count", pa.int64(), default=0)
    job = statelog.open(s3_root.url, store_options=dict(s3_root.options), max_parallelism=8)
    try:
        b = job.backend("op")
        st = b.get_state(count)
        for i in range(30):
            b.set_current_key(f"k{i % 7}")
            st.update(st.value() + 1)
        first = job.checkpoint(sources={})
        materialize(job.store, first)
        b.set_current_key("k0")
        st.update(100)
        job.checkpoint(sources={})
    finally:
        job.close()
    spec = jobs.Built(s3_root.url, dict(s3_root.options))
    _, rows = duck(spec, "SELECT key, value FROM op__count ORDER BY key")
    assert [(r["key"], r["value"]) for r in rows] == [("k0", 100), ("k1", 5), *((f"k{i}", 4) for i in range(2, 7))]
    _, changes = duck(spec, "SELECT key, op, value FROM op__count__changes", changes_from=first.checkpoint_id)
    assert changes == [{"key": "k0", "op": "put", "value": 100}]
    flags = [x for k, v in s3_root.options.items() for x in ("--store-option", f"{k}={v}")]
    code, out, err = run(capsys, "sql", s3_root.url, "SELECT count(*) AS n FROM op__count", "--json", *flags)
    assert code == 0 and json.loads(out) == [{"n": 7}], err
    code, out, err = run(capsys, "sql", s3_root.url, "SELECT * FROM nope", *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(s3_root.options["secret_key"]) not in out + err
