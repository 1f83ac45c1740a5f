"""The driver program of ``tests/statelog/spark/test_writer_cluster.py``: bootstraps a savepoint on a
standalone cluster into an ``s3://`` root, S3 settings in ``AWS_*`` only.

``python -m tests.support.spark.bootstrap_driver ARGS.json`` reads ``{master, root, keys, out}``,
builds value, list, map and aggregating state rows for ``keys`` keys as DataFrames
(:func:`value_of` is the test's model) and writes them with
:func:`statelog.spark.writer.write_savepoint` (savepoint ``boot``), then writes ``{"rows": ...}``
or ``{"error": ...}`` to ``out``.

With ``"check": CHECKPOINT`` and ``"deltas": {k: [d, ...]}`` in ARGS it instead compares every
state at that checkpoint with the model after a stream (``count += d``, ``seen`` gets
``"s<d>"``, ``attrs["c"]`` counts the events, ``avg`` adds ``d``) on the cluster (a full outer
join per state: bounded memory at 10**7 keys) and writes ``{"rows": {state: n},
"mismatches": {state: n}, "examples": {state: [...]}}``.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa

from statelog.state_processor import state_info
from tests.support.state_kinds import AVG_TYPE

OPERATOR = "counter"


def value_of(k: int) -> dict[str, Any]:
    """The model: each state's entry of key ``u<k>`` (lists and maps for every third key)."""
    out: dict[str, Any] = {"count": k, "avg": {"sum": k, "count": k % 7 + 1}}
    if k % 3 == 0:
        out["seen"] = [f"p{k % 5}", "home"]
        out["attrs"] = {"a": k, "b": -k}
    return out


def infos() -> dict[str, Any]:
    return {"count": state_info("count", "value", pa.int64()), "seen": state_info("seen", "list", pa.string()),
            "attrs": state_info("attrs", "map", pa.int64(), pa.string()),
            "avg": state_info("avg", "aggregating", AVG_TYPE)}


def main(args_path: str) -> None:
    import statelog.spark
    from statelog.spark.writer import write_savepoint

    args = json.loads(Path(args_path).read_text())
    spark = statelog.spark.session(args["master"], app_name="statelog-bootstrap-test", conf={
        "spark.executor.memory": "512m", "spark.cores.max": "2", "spark.sql.shuffle.partitions": "4"})
    try:
        keys = spark.range(args["keys"]).selectExpr("id AS k", "concat('u', id) AS key")
        frames = {
            "count": keys.selectExpr("key", "k AS value"),
            "avg": keys.selectExpr("key", "named_struct('sum', k, 'count', k % 7 + 1) AS value"),
            "seen": keys.where("k % 3 = 0").selectExpr("key", "array(concat('p', k % 5), 'home') AS value"),
            "attrs": keys.where("k % 3 = 0").selectExpr("key", "map('a', k, 'b', -k) AS value"),
        }
        i = infos()
        meta = write_savepoint(args["root"], "boot", {(OPERATOR, s): (i[s], df) for s, df in frames.items()},
                               max_parallelism=128, parallelism=2)
        Path(args["out"]).write_text(json.dumps({"rows": meta.stats["rows"]}))
    except Exception:  # reported to the test, which prints it
        Path(args["out"]).write_text(json.dumps({"error": traceback.format_exc()}))
    finally:
        spark.stop()


def expected_frames(spark: Any, keys: int, deltas: dict[str, list[int]]) -> dict[str, Any]:
    """Per state, the model's ``(key, value)`` rows after the bootstrap and the stream."""
    d = spark.createDataFrame([(int(k), [f"s{x}" for x in ds], sum(ds), len(ds)) for k, ds in deltas.items()],
                              "k long, ds array<string>, dsum long, dn long")
    base = spark.range(keys).selectExpr("id AS k").join(d, "k", "left")
    seen = "concat(CASE WHEN k % 3 = 0 THEN array(concat('p', k % 5), 'home') ELSE array() END, coalesce(ds, array()))"
    attrs = ("map_concat(CASE WHEN k % 3 = 0 THEN map('a', k, 'b', -k) ELSE map() END, "
             "CASE WHEN dn IS NULL THEN map() ELSE map('c', dn) END)")
    return {
        "count": base.selectExpr("concat('u', k) AS key", "k + coalesce(dsum, 0) AS value"),
        "avg": base.selectExpr("concat('u', k) AS key",
                               "named_struct('sum', k + coalesce(dsum, 0), 'count', k % 7 + 1 + coalesce(dn, 0)) AS value"),
        "seen": base.where("k % 3 = 0 OR dn IS NOT NULL").selectExpr("concat('u', k) AS key", f"{seen} AS value"),
        "attrs": base.where("k % 3 = 0 OR dn IS NOT NULL").selectExpr(
            "concat('u', k) AS key", f"array_sort(map_entries({attrs})) AS value"),
    }


def check(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    import statelog.spark

    out: dict[str, Any] = {"rows": {}, "mismatches": {}, "examples": {}}
    for s, want in expected_frames(spark, args["keys"], args["deltas"]).items():
        got = statelog.spark.read_state(spark, args["root"], OPERATOR, s, checkpoint=args["check"], partitions=32)
        value = "array_sort(map_entries(value))" if s == "attrs" else "value"
        got = got.selectExpr("key", f"{value} AS value")
        bad = got.alias("g").join(want.alias("w"), "key", "full_outer").where("NOT (g.value <=> w.value)")
        out["rows"][s] = got.count()
        out["mismatches"][s] = bad.count()
        out["examples"][s] = [str(r) for r in bad.limit(3).collect()]
    return out


if __name__ == "__main__":
    _args = json.loads(Path(sys.argv[1]).read_text())
    if "check" in _args:
        import statelog.spark

        _spark = statelog.spark.session(_args["master"], app_name="statelog-bootstrap-check", conf={
            "spark.executor.memory": "1g", "spark.cores.max": "2", "spark.sql.shuffle.partitions": "16"})
        try:
            Path(_args["out"]).write_text(json.dumps(check(_spark, _args)))
        except Exception:  # reported to the test, which prints it
            Path(_args["out"]).write_text(json.dumps({"error": traceback.format_exc()}))
        finally:
            _spark.stop()
    else:
        main(sys.argv[1])
