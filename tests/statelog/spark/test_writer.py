"""Writing state from Spark: a checkpoint read with Spark and written back unchanged as a savepoint
has every row (read with Spark and in-process, as DuckDB reads), also with a new
max_parallelism; ``df.write.format("statelog")`` writes one state; a failed write publishes nothing."""

from __future__ import annotations

import json
import pickle
import time
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.gc.collect import collect_garbage
from statelog.descriptors import StateInfo
from statelog.layout import savepoint_prefix
from statelog.spark.writer import UnitTask, by_unit, write_savepoint
from statelog.state_processor import read_state, states_of
from statelog.state_processor.progress import task_marker_first
from statelog.store import open_store
from tests.support.spark import jobs
from tools.roots import open_root
from tools.sql.duckdb import run_query
from tools.sql.spark import spark_query
from tools.sql.views import plan_views
from tools.verify import verify_root


def _read(spark: Any, root: str, which: Any, uid: str, state: str) -> Any:
    return statelog.spark.read_state(spark, root, uid, state, checkpoint=which)


def _local_rows(root: str, which: Any, uid: str, state: str) -> set[tuple]:
    with statelog.open(root, create=False) as job:
        t = read_state(job, job.resolve_checkpoint(which), uid, state)
    out = set()
    for r in t.to_pylist():
        r.pop("key_group")
        if "value_pickle" in r:
            r["value"] = pickle.loads(r.pop("value_pickle"))
        out.add(tuple((k, jobs.norm(v)) for k, v in sorted(r.items())))
    return out


@pytest.mark.parametrize("max_parallelism", [jobs.MAXP, 48])
def test_round_trip_through_spark(spark: Any, built_file: jobs.Built, tmp_path: Path, max_parallelism: int) -> None:
    b = built_file
    with statelog.open(b.root, create=False) as job:
        infos = states_of(job.load_checkpoint(b.c3))
    target = (tmp_path / "sp").as_uri()
    # every state with a new max_parallelism; one of each kind (and the timers) with the same one
    names = jobs.STATES if max_parallelism != jobs.MAXP else ["count", "seen", "attrs", "avg", "__timers_event"]
    states = {("op", s): (infos["op"][s], _read(spark, b.root, b.c3, "op", s)) for s in names}
    states[("words", "n")] = (infos["words"]["n"], _read(spark, b.root, b.c3, "words", "n"))
    meta = write_savepoint(target, "copy", states, max_parallelism=max_parallelism, parallelism={"op": 2})
    assert (meta.kind, meta.max_parallelism, meta.operators["op"].parallelism) == ("savepoint", max_parallelism, 2)
    with open_root(target, {}) as root:
        report = verify_root(root)
    assert report.ok and report.savepoints == ["copy"], report.faults
    for uid, s in [*(("op", s) for s in names), ("words", "n")]:
        if s in ("count", "seen", "ttl_m", "pmap", "__timers_event"):  # Spark SQL on a few, in-process on all
            assert jobs.spark_rows(_read(spark, target, "savepoint:copy", uid, s), s) == \
                jobs.spark_rows(_read(spark, b.root, b.c3, uid, s), s), s
        assert _local_rows(target, "savepoint:copy", uid, s) == _local_rows(b.root, b.c3, uid, s), s
    # the views of `statelog sql` on both engines: the same rows (key groups apart, which a new
    # max_parallelism changes)
    for uid, s in [("op", "count"), ("op", "attrs"), ("op", "avg"), ("words", "n")]:
        for engine in ("duckdb", "spark") if s in ("count", "attrs") else ("duckdb",):
            assert _sql_rows(engine, spark, target, "savepoint:copy", uid, s) == \
                _sql_rows(engine, spark, b.root, str(b.c3), uid, s), (engine, uid, s)


def _sql_rows(engine: str, spark: Any, root: str, checkpoint: str, uid: str, state: str) -> list[str]:
    """The rows of a state's view in ``statelog sql`` on ``engine`` (without the key group)."""
    plan = plan_views(root, {}, checkpoint)
    (view,) = [n for n, v in plan.states.items() if v == (uid, state)]
    run = run_query if engine == "duckdb" else partial(spark_query, spark)
    columns, _ = run_query(plan, {}, None, f"SELECT * FROM {view} LIMIT 0", [view], 0)  # the same on both
    keep = ", ".join(c for c in columns if c != "key_group")
    _, rows = run(plan, {}, None, f"SELECT {keep} FROM {view}", [view], 10**6)
    assert rows, (engine, root, uid, state)
    return sorted(map(repr, rows))


def _writer(df: Any, root: str, name: str, **options: Any) -> Any:
    w = df.write.format("statelog").mode("append").option("root", root).option("savepoint", name)
    for k, v in options.items():
        w = w.option(k, str(v))
    return w


def test_df_write_format_statelog(spark: Any, tmp_path: Path) -> None:
    root = (tmp_path / "r").as_uri()
    df = spark.createDataFrame([(f"k{i}", i, [f"x{i}"]) for i in range(300)], "key string, value long, seen array<string>")
    _writer(by_unit(df.select("key", "value"), 64), root, "boot", operator="counter", state="count",
            kind="value", valueType="int64", maxParallelism=64, parallelism=3).save()
    assert _markers(root, "boot") == []  # deleted once the savepoint is published
    got = _read(spark, root, "savepoint:boot", "counter", "count").selectExpr("key", "value").collect()
    assert sorted((r["key"], r["value"]) for r in got) == [(f"k{i}", i) for i in sorted(range(300), key=lambda i: f"k{i}")]
    with statelog.open(root, create=False) as job:
        meta = job.load_savepoint("boot")
        assert meta.operators["counter"].parallelism == 3
        b = job.backend("counter", subtask=0, parallelism=1, restore="savepoint:boot", changelog=False)
        b.get_state(statelog.ValueStateDescriptor("count", pa.int64()))
        assert len(list(b.entries("count"))) == 300
    info = meta.operators["counter"].states["count"].to_json() | {"name": "count2"}
    _writer(by_unit(df.select("key", "value"), 64), root, "boot2", operator="counter", state="count2",
            stateInfo=json.dumps(info)).save()
    assert _read(spark, root, "savepoint:boot2", "counter", "count2").count() == 300


def _markers(root: str, name: str) -> list[str]:
    store = open_store(root)
    try:
        return [o.key for o in store.list(savepoint_prefix(name)) if "/_writing-" in o.key]
    finally:
        store.close()


def test_a_spark_task_keeps_its_own_marker_while_it_consumes_and_writes(tmp_path: Path) -> None:
    """The driver's process plans and commits but may not live through a long stage: each task
    keeps a marker of its own (GC leaves the savepoint alone while one is young) and deletes
    it when it ends; its files then protect the savepoint until the commit."""
    root = (tmp_path / "r").as_uri()
    statelog.open(root, max_parallelism=16).close()
    info = StateInfo.from_descriptor(statelog.ValueStateDescriptor("count", pa.int64()))
    task = UnitTask(root, {}, "sp", "m-0", 0, "counter", info.to_json(), 16)
    seen: list[list[str]] = []

    def batches() -> Any:
        seen.append(_markers(root, "sp"))  # while the task consumes its input
        yield pa.record_batch({"key": ["a", "b"], "value": [1, 2]})

    out = task.run(batches())
    assert out["rows"] == 2 and out["files"]
    assert len(seen[0]) == 1 and seen[0][0].startswith("savepoints/sp/_writing-"), seen
    assert _markers(root, "sp") == [], "the task's marker outlived it"
    assert len({task_marker_first() for _ in range(100)}) == 100  # two tasks never share a marker key


def _nothing_below(root: str, name: str) -> None:
    """Nothing published, and nothing left that GC would not collect: abort deletes what the
    tasks it heard of wrote, but a task still running when the job failed may finish after it
    (its unit's file stays until GC's grace period has passed)."""
    store = open_store(root)
    try:
        assert not store.exists(f"{savepoint_prefix(name)}_metadata.json")
        if list(store.list(savepoint_prefix(name))):
            collect_garbage(store, grace_s=0, now=time.time() + 3600)
        assert list(store.list(savepoint_prefix(name))) == []
    finally:
        store.close()


def test_bad_rows_and_split_units_publish_nothing(spark: Any, tmp_path: Path) -> None:
    root = (tmp_path / "r").as_uri()
    dup = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], "key string, value long")
    with pytest.raises(Exception, match="operator 'counter', state 'count', column 'key': duplicate key 'a'"):
        _writer(by_unit(dup, 16), root, "dup", operator="counter", state="count", kind="value",
                valueType="int64", maxParallelism=16).save()
    _nothing_below(root, "dup")
    spread = spark.createDataFrame([(f"k{i}", i) for i in range(200)], "key string, value long").repartition(4)
    with pytest.raises(Exception, match="came in more than one partition; repartition with"):
        _writer(spread, root, "spread", operator="counter", state="count", kind="value", valueType="int64").save()
    _nothing_below(root, "spread")
    with pytest.raises(Exception, match="unknown state kind 'set'"):
        _writer(dup, root, "kind", operator="counter", state="s", kind="set", valueType="int64").save()
    one = spark.createDataFrame([("a", 1)], "key string, value long")
    _writer(by_unit(one, 16), root, "ok", operator="c", state="n", kind="value", valueType="int64").save()
    with pytest.raises(Exception, match="savepoint 'ok' already exists"):
        _writer(by_unit(one, 16), root, "ok", operator="c", state="n", kind="value", valueType="int64").save()
