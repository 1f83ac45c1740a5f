"""``format("statelog-metadata")``: checkpoints, operators, states, subtasks, materializations, files."""

from __future__ import annotations

from typing import Any

import pytest

import statelog
from statelog.readers.metadata import TABLES
from tests.support.spark import jobs
from tests.support.spark.reading import collect_all


def meta(spark: Any, b: jobs.Built, table: str, **options: Any) -> Any:
    r = spark.read.format("statelog-metadata").option("root", b.root).option("table", table)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def test_metadata_tables(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    dfs = [meta(spark, b, t) for t in TABLES]
    checkpoints, operators, states, subtasks, materializations, files = collect_all(dfs)
    assert [r["checkpoint_id"] for r in checkpoints] == [b.c1, b.c2, b.c3, b.c4]
    first = checkpoints[0]
    assert first["kind"] == "checkpoint" and first["max_parallelism"] == jobs.MAXP
    assert first["operators"] == ["op", "words"] and first["materializations"] == []
    assert checkpoints[2]["materializations"] == [b.m1]
    assert first["changelog_bytes"] > 0 and first["metadata_bytes"] > 0
    op3 = next(r for r in operators if r["checkpoint_id"] == b.c3 and r["operator"] == "op")
    assert op3["parallelism"] == 2 and op3["materialized_rows"] > 0 and op3["changelog_ranges"] > 0
    assert set(op3["states"]) == {d.name for d in jobs.DESCRIPTORS}
    ttl = next(r for r in states if r["checkpoint_id"] == b.c3 and r["state"] == "ttl_m")
    assert (ttl["state_kind"], ttl["value_type"], ttl["user_key_type"], ttl["ttl_ms"]) == \
        ("map", "pickle", "string", jobs.TTL_MS)
    assert any(r["internal"] and r["state"] == "__timers_event" for r in states)
    ranges = sorted((r["key_group_start"], r["key_group_end"]) for r in subtasks
                    if r["checkpoint_id"] == b.c3 and r["operator"] == "op")
    assert ranges == [(0, 7), (8, 15)]
    m1 = next(r for r in materializations if r["manifest"] == b.m1)
    assert m1["checkpoint_id"] == b.c1 and m1["referenced_by"] == [b.c2, b.c3, b.c4]
    assert m1["rows"] == sum(r["rows"] for r in files if r["manifest"] == b.m1)
    job = statelog.open(b.root, create=False)
    try:
        sizes = {o.key: o.size for o in job.store.list("materializations/data/")}
    finally:
        job.close()
    assert all(sizes[r["path"]] == r["bytes"] for r in files)


def test_metadata_of_one_checkpoint_and_errors(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    rows = meta(spark, b, "subtasks", checkpoint=b.c1).collect()
    assert {r["checkpoint_id"] for r in rows} == {b.c1} and all(r["materialization"] == [] for r in rows)
    with pytest.raises(Exception, match=r'option "table" must be one of checkpoints, operators'):
        meta(spark, b, "nope")
    with pytest.raises(Exception, match=r"checkpoint 999 does not exist"):
        meta(spark, b, "states", checkpoint=999).collect()
