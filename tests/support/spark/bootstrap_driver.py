"""The driver program of ``tests/statelog/spark/test_writer_cluster.py``: bootstraps a savepoint on a
standalone cluster into an ``s3://`` root, S3 settings in ``AWS_*`` only.

``python -m tests.support.spark.bootstrap_driver ARGS.json`` reads ``{master, root, keys, out}``,
builds value, list, map and aggregating state rows for ``keys`` keys as DataFrames
(:func:`rows`, the test's model) and writes them with
:func:`statelog.spark.writer.write_savepoint` (savepoint ``boot``), then writes ``{"rows": ...}``
or ``{"error": ...}`` to ``out``.
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


if __name__ == "__main__":
    main(sys.argv[1])
