"""A stream job on a real Spark cluster: its workers are the tasks of a barrier stage.

The session's standalone cluster (``standalone_cluster``: a master and two workers of 2 cores
each on 127.0.0.1, ``tests/support/spark/cluster.py``) runs it; the workers, and so their executors,
have no ``AWS_*`` variable. The driver
program (``stream_driver.py``, a separate process: one SparkContext per process) runs the
clicks job at parallelism 4 with ``cluster="spark"`` on an ``s3://`` root (SeaweedFS; the
endpoint and credentials only in the driver's environment), SIGKILLs the Python process of
one barrier task after a checkpoint completed, and the job master restarts the job from its
latest checkpoint as a new barrier stage. The committed output must equal the golden output
exactly, and the S3 secret key must appear in no log.
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
from runtime import read_committed
from tests.support import jobs
from tests.support.s3server import S3Server
from tests.support.spark import cluster

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.fault, pytest.mark.xdist_group("cluster")]

REPO = Path(__file__).resolve().parents[3]
DRIVER_TIMEOUT = 600.0
PER_SPLIT = 3000
RATE = 500.0  # records/s per split: ~6 s of input, so the kill lands mid-run


def test_clicks_at_parallelism_4_on_a_standalone_cluster_survive_a_killed_task(
    s3_server: S3Server, standalone_cluster: cluster.SparkCluster, tmp_path: Path
) -> None:
    root = f"s3://{s3_server.bucket}/stream-cluster-{uuid.uuid4().hex}"
    out, result_path, args = tmp_path / "out", tmp_path / "result.json", tmp_path / "args.json"
    c = standalone_cluster
    mark = c.log_mark()
    args.write_text(json.dumps({"master": c.master_url, "root": root, "out": str(out), "per_split": PER_SPLIT,
                                "rate": RATE, "parallelism": 4, "result": str(result_path)}))
    env = cluster.driver_env(s3_server)
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as log:
        run = subprocess.run([sys.executable, "-m", "tests.support.spark.stream_driver", str(args)], cwd=REPO, env=env,
                             stdout=log, stderr=subprocess.STDOUT, timeout=DRIVER_TIMEOUT)
    cluster_logs = c.log_text(since=mark)
    driver_output = driver_log.read_text(errors="replace")
    assert run.returncode == 0, driver_output[-6000:]
    result = json.loads(result_path.read_text())

    # one barrier task's Python process was killed mid-run; the job master restarted the job
    assert "pyspark" in result["killed_cmdline"], result["killed_cmdline"]
    assert result["killed_after_checkpoints"] >= 1
    assert result["attempts"] >= 2, result
    assert any("worker" in f for f in result["failures"]), result["failures"]
    pids1, pids2 = result["pids"]["1"], result["pids"].get("2", [])
    assert len(pids1) == 4 and len(set(pids1)) == 4
    assert result["killed"] not in pids2
    # the executors ran the workers: the pids belong to neither the driver nor this process
    assert os.getpid() not in pids1

    # exactly once: the committed output is the golden output
    assert sorted(read_committed(out)) == jobs.golden_windows(PER_SPLIT)
    with statelog.open(root, store_options=s3_server.options(), create=False) as job:
        latest = job.catalog.latest()
        assert latest is not None and latest.checkpoint_id >= 2
        assert all(pos["next"] == PER_SPLIT for pos in latest.sources["clicks"].values())

    # the executors really ran on the cluster's workers, and the secret key is in no log
    assert "Launch command" in cluster_logs
    for what, text in {"driver output": driver_output, "cluster logs": cluster_logs}.items():
        assert s3_server.secret_key not in text, f"the S3 secret key appears in the {what}"


def test_a_fenced_driver_ends_its_barrier_stage(
    s3_server: S3Server, standalone_cluster: cluster.SparkCluster, tmp_path: Path
) -> None:
    """The job master (the Spark driver) loses the root's writer lease to another copy: the
    job ends with FencedError in its first attempt (no restart) and its barrier stage ends."""
    root = f"s3://{s3_server.bucket}/stream-fence-{uuid.uuid4().hex}"
    out, result_path, args = tmp_path / "out", tmp_path / "result.json", tmp_path / "args.json"
    args.write_text(json.dumps({"master": standalone_cluster.master_url, "root": root, "out": str(out),
                                "per_split": PER_SPLIT, "rate": RATE / 5, "parallelism": 2,
                                "result": str(result_path), "fence": True}))  # fmt: skip
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as log:
        run = subprocess.run([sys.executable, "-m", "tests.support.spark.stream_driver", str(args)], cwd=REPO,
                             env=cluster.driver_env(s3_server), stdout=log, stderr=subprocess.STDOUT,
                             timeout=DRIVER_TIMEOUT)  # fmt: skip
    assert run.returncode == 0, driver_log.read_text(errors="replace")[-6000:]
    result = json.loads(result_path.read_text())
    assert result["error"] is not None and "stops for good" in result["error"], result
    assert root in result["error"] and "'the other copy'" in result["error"], result["error"]
    assert result["attempts"] == 1, result
    assert result["active_jobs"] == [], result  # the barrier stage was cancelled with the job
    assert result["workers_alive"] == [], result
    assert result["holder"]["generation"] == result["taken_generation"]
