"""``statelog materializer run --engine spark`` on a real standalone cluster and an S3 root.

The session's standalone cluster (``standalone_cluster``: a master and two workers on
127.0.0.1, ``tests/support/spark/cluster.py``) runs it; the workers, and so their executors, have no
``AWS_*`` variable. The CLI runs as a separate process (one SparkContext
per process) with the SeaweedFS endpoint and credentials in its ``AWS_*`` environment only
and no store option; the executors must write the tables with the settings the driver
resolved and shipped inside the pickled tasks. The published materialization must equal
the in-process one file by file, and the secret key must appear in no driver output,
cluster log (master, worker, executors) or event log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import statelog
from materializer.build import materialize
from statelog.materialization.manifest import load_manifest
from tests.support.s3server import S3Server
from tests.support.spark import cluster, jobs
from tests.support.spark.jobs import assert_same_tables

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.xdist_group("cluster")]

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT = 300.0


def test_materializer_engine_spark_on_a_cluster_without_aws_env(
    s3_server: S3Server, standalone_cluster: cluster.SparkCluster, tmp_path: Path
) -> None:
    secret = s3_server.secret_key
    root = f"s3://{s3_server.bucket}/cluster-mat-{uuid.uuid4().hex}"
    b = jobs.build(root, s3_server.options(), seed=9, ops=120)
    event_log = tmp_path / "events"
    event_log.mkdir()
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    c = standalone_cluster
    mark = c.log_mark()
    (conf_dir / "spark-defaults.conf").write_text(
        (Path(os.environ["SPARK_CONF_DIR"]) / "spark-defaults.conf").read_text() + "spark.executor.memory 512m\nspark.cores.max 2\nspark.eventLog.enabled true\n"
        f"spark.eventLog.dir {event_log.as_uri()}\nspark.eventLog.compress false\n"
    )
    env = cluster.driver_env(s3_server, SPARK_CONF_DIR=str(conf_dir))
    run = subprocess.run(
        [sys.executable, "-m", "tools", "-vv", "materializer", "run", root, "--once", "--engine", "spark",
         "--spark-master", c.master_url, "--no-gc", "--max-tail-bytes", "1", "--json"],
        cwd=REPO, env=env, capture_output=True, timeout=CLI_TIMEOUT,
    )
    cluster_logs = c.log_text(since=mark)
    out, err = run.stdout.decode(errors="replace"), run.stderr.decode(errors="replace")
    assert run.returncode == 0, (out + err)[-5000:]
    summary = json.loads(out)
    assert summary["action"] == "materialized" and summary["materialization"]["checkpoint_id"] == b.c4, summary

    job = statelog.open(root, store_options=s3_server.options(), create=False)
    try:
        theirs = load_manifest(job.store, summary["materialization"]["manifest"])
        assert assert_same_tables(job.store, materialize(job.store, job.load_checkpoint(b.c4)), theirs) > 0
    finally:
        job.close()

    # the tasks really ran on the worker's executors, and the secret is nowhere
    assert "Executor" in cluster_logs and "Launch command" in cluster_logs
    assert "Spark task(s)" in err  # -vv: the engine's log line
    events = "\n".join(p.read_text(errors="replace") for p in event_log.rglob("*") if p.is_file())
    assert "SparkListenerApplicationStart" in events and "statelog-materialize" in events
    for what, text in {"driver output": out + err, "cluster logs": cluster_logs, "event log": events}.items():
        assert secret not in text, f"the secret key appears in the {what}"
