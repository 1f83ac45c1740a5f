"""The driver program of ``test_cluster.py``: runs against a standalone master, S3 settings in ``AWS_*`` only.

``python -m tests.support.spark.cluster_driver ARGS.json`` reads ``{master, root, rescale_root, c2, c3,
out, event_log}``, runs the statelog data sources (state rows, the change feed, metadata) and the
restore job on the cluster without any store option (the endpoint and credentials are only in this
process's environment), and pickles what it saw to ``out``: the rows, the plans as ``explain()``
prints them, every error and the command line of every process it could read while Spark ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any


def _cmdlines() -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                out.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def _explain(df: Any) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        for mode in ("extended", "formatted", "cost"):
            df.explain(mode)
    return buf.getvalue() + "\n" + df._jdf.queryExecution().toString()


def main(args_path: str) -> None:
    import statelog.spark
    from statelog.spark.rescale.driver import restore
    from tests.support.spark import jobs

    args = json.loads(Path(args_path).read_text())
    result: dict[str, Any] = {"errors": {}, "plans": []}
    spark = statelog.spark.session(args["master"], app_name="statelog-cluster-test", conf={
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": args["event_log"],
        "spark.eventLog.compress": "false",
    })
    spark.sparkContext.setLogLevel("INFO")
    try:
        def attempt(name: str, fn: Any) -> None:
            try:
                result[name] = fn()
            except Exception as e:  # noqa: BLE001 - reported to the test
                result["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"

        state = (spark.read.format("statelog").option("root", args["root"]).option("operator", "op")
                 .option("state", "count").option("checkpoint", str(args["c3"])).option("partitions", "3").load())
        result["plans"].append(_explain(state))
        attempt("state", lambda: sorted(jobs.spark_rows(state, "count"), key=repr))
        feed = (spark.read.format("statelog").option("root", args["root"]).option("operator", "op")
                .option("state", "count").option("changesFrom", str(args["c2"]))
                .option("changesTo", str(args["c3"])).load())
        result["plans"].append(_explain(feed))
        attempt("feed", lambda: len(feed.collect()))
        meta = spark.read.format("statelog-metadata").option("root", args["root"]).option("table", "checkpoints").load()
        result["plans"].append(_explain(meta))
        attempt("metadata", lambda: sorted(r["checkpoint_id"] for r in meta.collect()))
        attempt("rescale", lambda: restore(spark, args["rescale_root"], args["c3"], parallelism=3,
                                           savepoint="cluster-p3").rows)
        result["cmdlines"] = _cmdlines()
    finally:
        spark.stop()
    Path(args["out"]).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
