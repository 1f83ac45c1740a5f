"""``format("statelog")``: for every state kind and several checkpoints the rows equal a backend
restore, on ``file://`` and ``s3://``; typed keys, TTL expiry, partitions, clear errors."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog.keys.encoding import decode_key, encode_key
from statelog.readers.options import to_spark_options
from tests.support.spark import jobs


def reader(spark: Any, b: jobs.Built, **options: Any) -> Any:
    r = spark.read.format("statelog").option("root", b.root)
    for k, v in {**to_spark_options(b.options), **options}.items():
        r = r.option(k, str(v))
    return r


def read(spark: Any, b: jobs.Built, state: str, checkpoint: Any, operator: str = "op", **options: Any) -> Any:
    return reader(spark, b, operator=operator, state=state, checkpoint=checkpoint, **options).load()


def collect_all(dfs: list[Any]) -> list[list[Any]]:
    """Collect several DataFrames concurrently (Spark runs the jobs side by side)."""
    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(lambda df: df.collect(), dfs))


def _kinds_of(meta: Any) -> tuple[bool, bool]:
    """(builds on a materialization, has a changelog tail) of operator ``op``."""
    hs = meta.operators["op"].subtasks
    return any(h.materialization for h in hs), any(h.changelog for h in hs)


def test_rows_equal_the_backend_restore_for_every_state_kind_and_checkpoint(spark: Any, built: jobs.Built) -> None:
    job = statelog.open(built.root, store_options=built.options or None, create=False)
    try:
        # the premise: c1 changelog only, c2 materialized without tail, c3 materialized with a tail
        assert _kinds_of(job.load_checkpoint(built.c1)) == (False, True)
        assert _kinds_of(job.load_checkpoint(built.c2)) == (True, False)
        assert _kinds_of(job.load_checkpoint(built.c3)) == (True, True)
        # file:// at every checkpoint; s3:// with and without a tail (c1 differs only in the store reads)
        cids = (built.c1, built.c2, built.c3) if built.root.startswith("file:") else (built.c2, built.c3)
        cases = [(c, s) for c in cids for s in jobs.STATES]
        results = collect_all([read(spark, built, s, c, partitions=2) for c, s in cases])
        for (cid, state), rows in zip(cases, results, strict=True):
            got = {_triple(r, state) for r in rows}
            assert len(got) == len(rows), (cid, state, "duplicate rows")
            assert got == jobs.restored_rows(job, cid, state), (cid, state)
            if state.startswith("ttl_"):
                _check_expiry(rows, state, built.expiry[cid])
            elif not state.startswith("__"):
                assert all(r["expires_ms"] is None for r in rows), state
            for r in rows:
                kb = bytes(r["key_bytes"])
                assert r["key_group"] == statelog.key_group_of(decode_key(kb), jobs.MAXP)
                assert r["key"] == jobs_render(decode_key(kb))
    finally:
        job.close()


def jobs_render(key: Any) -> str | None:
    return None if key is None else key if type(key) is str else repr(key)


def _triple(r: Any, state: str) -> tuple:
    return jobs.row_triple(r, state)


def _check_expiry(rows: list[Any], state: str, expected: dict[tuple[str, bytes], Any]) -> None:
    want = {kb: exp for (s, kb), exp in expected.items() if s == state}
    got = {}
    for r in rows:
        exp = r["expires_ms"]
        got[bytes(r["key_bytes"])] = dict(exp) if isinstance(exp, dict) else exp
    assert got == want, state


def test_typed_values_namespaces_and_pickles(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    avg, blob, pmap, seen = collect_all([read(spark, b, s, b.c3) for s in ("avg", "blob", "pmap", "seen")])
    # aggregating state with a struct accumulator: a struct column
    row = avg[0]
    assert set(row["value"].asDict()) == {"sum", "count"}
    # pickled values: a readable rendering plus the exact pickle
    for r in blob:
        obj = pickle.loads(r["value_pickle"])
        assert isinstance(obj["tags"], set) and r["value"].startswith(f"{{'n': {obj['n']}, 'tags': {{")
    # pickled map keys: rendered keys, the exact dict in value_pickle
    for r in pmap:
        d = pickle.loads(r["value_pickle"])
        assert dict(r["value"]) == {repr(k) if type(k) is not str else k: v for k, v in d.items()}
    # namespaces: None is null, windows are rendered tuples, namespace_bytes is exact
    nss = {(r["namespace"], bytes(r["namespace_bytes"])) for r in seen}
    assert (None, encode_key(None)) in nss
    assert ("(0, 1000)", encode_key((0, 1000))) in nss


def test_key_type_gives_a_typed_key_column(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    df = read(spark, b, "n", b.c4, operator="words", keyType="string")
    assert df.schema["key"].dataType.simpleString() == "string"
    assert "key_bytes" not in df.columns
    rows = {r["key"]: r["value"] for r in df.collect()}
    job = statelog.open(b.root, create=False)
    try:
        back = job.backend("words", restore=b.c4, changelog=False)
        from statelog import ValueStateDescriptor

        back.get_state(ValueStateDescriptor("n", pa.int64()))
        assert rows == {k: v for k, _ns, v in back.entries("n")}
        assert rows["w0"] == 999
    finally:
        job.close()
    # a key type that does not fit the keys fails clearly
    with pytest.raises(Exception, match=r"keyType.*int64.*holds key 'w"):
        read(spark, b, "n", b.c4, operator="words", keyType="int64").collect()


def test_partitions_follow_key_group_ranges(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    one, three = read(spark, b, "count", b.c3, partitions=1), read(spark, b, "count", b.c3, partitions=3)
    assert one.rdd.getNumPartitions() == 1 and three.rdd.getNumPartitions() == 3
    parts = three.rdd.glom().collect()
    ranges = [statelog.key_group_range_for_subtask(jobs.MAXP, 3, i) for i in range(3)]
    for rows, kgr in zip(parts, ranges, strict=True):
        assert all(kgr.start <= r["key_group"] <= kgr.end for r in rows)
    assert sorted(map(tuple, one.collect()), key=repr) == sorted((tuple(r) for p in parts for r in p), key=repr)
    # the default: max(2, the operator's parallelism)
    assert read(spark, b, "count", b.c3).rdd.getNumPartitions() == 2


def test_latest_is_resolved_once_and_savepoints_are_readable(spark: Any, built_file: jobs.Built) -> None:
    b = built_file
    latest = read(spark, b, "count", "latest")
    assert {_triple(r, "count") for r in latest.collect()} == \
        {_triple(r, "count") for r in read(spark, b, "count", b.c4).collect()}


INVALID = [
    ({"operator": "nope", "state": "count"}, r"operator 'nope' does not exist in checkpoint \d+ \(operators: op, words\)"),
    ({"operator": "op", "state": "nope"}, r"state 'nope' does not exist for operator 'op'"),
    ({"operator": "op", "state": "count", "checkpoint": "999"}, r"checkpoint 999 does not exist .*retained checkpoints: 1, 2, 3, 4"),
    ({"operator": "op", "state": "count", "checkpoint": "savepoint:none"}, r"savepoint 'none' does not exist"),
    ({"operator": "op", "state": "count", "checkpoint": "yesterday"}, r'option "checkpoint" must be "latest", a checkpoint id'),
    ({"state": "count"}, r'option "operator" is required'),
    ({"operator": "op", "state": "count", "keyType": "nonsense"}, r'option "keyType": unknown Arrow type name'),
    ({"operator": "op", "state": "count", "partitions": "0"}, r'option "partitions" must be a whole number in 1..16'),
    ({"operator": "op", "state": "count", "partitions": "17"}, r'option "partitions" must be a whole number in 1..16'),
    ({"operator": "op", "state": "count", "changesFrom": "3", "changesTo": "1"}, r"changesFrom \(3\) is after changesTo \(1\)"),
    ({"operator": "op", "state": "count", "changesTo": "3"}, r'option "changesFrom" is required'),
]


def test_invalid_options_fail_clearly_in_spark(spark: Any, built_file: jobs.Built) -> None:
    """Through Spark (the error is raised in a Python worker and names the problem)."""
    for i in (0, 2, 8):
        options, message = INVALID[i]
        with pytest.raises(Exception, match=message):
            reader(spark, built_file, **options).load()


@pytest.mark.parametrize(("options", "message"), INVALID)
def test_invalid_options_fail_clearly(built_file: jobs.Built, options: dict, message: str) -> None:
    """The same checks without Spark: what the worker runs when a DataFrame is created."""
    from statelog.spark.datasource import StatelogDataSource

    source = StatelogDataSource({"root": built_file.root, **{k.lower(): v for k, v in options.items()}})
    with pytest.raises(statelog.StatelogError, match=message):
        source.schema()


def test_root_errors(spark: Any, tmp_path: Any) -> None:
    with pytest.raises(Exception, match=r'option "root" is required'):
        spark.read.format("statelog").option("operator", "op").option("state", "s").load()
    with pytest.raises(Exception, match=r"is not a statelog job root \(no job.json\)"):
        spark.read.format("statelog").option("root", tmp_path.as_uri()).option("operator", "op") \
            .option("state", "s").load()
    assert not (tmp_path / "job.json").exists()  # never created


@pytest.mark.s3
def test_s3_store_options_reach_the_workers_and_secrets_stay_hidden(spark: Any, built_s3: jobs.Built) -> None:
    b = built_s3
    secret = b.options["secret_key"]
    df = read(spark, b, "count", b.c3)
    plan = df._jdf.queryExecution().toString()
    assert secret not in plan
    assert len(df.collect()) > 0
    wrong = jobs.Built(b.root, {**b.options, "secret_key": "x" * 40})
    with pytest.raises(Exception) as info:
        read(spark, wrong, "count", b.c3)
    text = str(info.value)
    assert "x" * 40 not in text and secret not in text
    assert "credentials" in text.lower() or "denied" in text.lower() or "signature" in text.lower()
