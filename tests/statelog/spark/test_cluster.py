"""The data sources and the restore job on a real standalone cluster, S3 settings in the driver's env only.

The session's standalone cluster (``standalone_cluster``: a master and two workers on
127.0.0.1, ``tests/support/spark/cluster.py``) runs it; the workers, and so their executors, have no
``AWS_*`` variable. The driver program (``cluster_driver.py``, a separate
process: one SparkContext per process) has the SeaweedFS endpoint and credentials in its
``AWS_*`` environment and passes no store option. The executors must read the state exactly
(the driver ships the resolved store settings inside the pickled reader), and the secret key
must appear in no plan, log, event log or command line.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import statelog
from tests.support.s3server import S3Server
from tests.support.spark import cluster, jobs

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.xdist_group("cluster")]

REPO = Path(__file__).resolve().parents[3]
DRIVER_TIMEOUT = 300.0


def test_executors_without_aws_env_read_s3_state_and_the_secret_stays_hidden(
    s3_server: S3Server, built_s3: jobs.Built, standalone_cluster: cluster.SparkCluster, tmp_path: Path
) -> None:
    b = built_s3
    secret = s3_server.secret_key
    rescale_root = f"s3://{s3_server.bucket}/cluster-{uuid.uuid4().hex}"
    small = jobs.build(rescale_root, s3_server.options(), seed=3, ops=80)
    out, event_log = tmp_path / "result.pickle", tmp_path / "events"
    event_log.mkdir()
    args = tmp_path / "args.json"
    c = standalone_cluster
    mark = c.log_mark()
    args.write_text(json.dumps({"master": c.master_url, "root": b.root, "rescale_root": rescale_root,
                                "c2": b.c2, "c3": b.c3, "out": str(out), "event_log": event_log.as_uri()}))
    env = cluster.driver_env(s3_server)
    run = subprocess.run([sys.executable, "-m", "tests.support.spark.cluster_driver", str(args)], cwd=REPO, env=env,
                         capture_output=True, timeout=DRIVER_TIMEOUT)
    cluster_logs = c.log_text(since=mark)
    driver_output = run.stdout.decode(errors="replace") + run.stderr.decode(errors="replace")
    assert run.returncode == 0, driver_output[-5000:]
    result = pickle.loads(out.read_bytes())
    assert result["errors"] == {}, "\n".join(result["errors"].values())

    job = statelog.open(b.root, store_options=b.options, create=False)
    try:
        assert set(result["state"]) == jobs.restored_rows(job, b.c3, "count")
        assert result["feed"] > 0
        assert result["metadata"] == sorted(job.catalog.checkpoint_ids())
    finally:
        job.close()
    small_job = statelog.open(rescale_root, store_options=s3_server.options(), create=False)
    try:
        assert result["rescale"] > 0
        assert jobs.restored_rows(small_job, "savepoint:cluster-p3", "count", parallelism=3) == \
            jobs.restored_rows(small_job, small.c3, "count")
    finally:
        small_job.close()

    # the executors really ran on the worker (their logs are there), and the secret is nowhere
    assert "Executor" in cluster_logs and "Launch command" in cluster_logs
    events = "\n".join(p.read_text(errors="replace") for p in event_log.rglob("*") if p.is_file())
    assert "SparkListenerApplicationStart" in events
    renderings = {"plans": "\n".join(result["plans"]), "driver output": driver_output,
                  "cluster logs": cluster_logs, "event log": events, "process list": "\n".join(result["cmdlines"])}
    for what, text in renderings.items():
        assert secret not in text, f"the secret key appears in the {what}"
