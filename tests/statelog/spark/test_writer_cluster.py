"""Bootstrap on the standalone cluster into an ``s3://`` root (S3 settings in the driver's ``AWS_*``
only): value, list, map and aggregating states from DataFrames; ``statelog verify`` passes and a
restore at parallelism 3 holds exactly the model's entries. ``STATELOG_BOOTSTRAP_KEYS`` sets the
number of keys (default 3000; the acceptance run uses 10**7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import statelog
from statelog.readers.restore import FAR_PAST_MS, descriptor_of
from tests.support.s3server import S3Server
from tests.support.spark import bootstrap_driver, cluster
from tools.roots import open_root
from tools.verify import verify_root

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.xdist_group("cluster")]

REPO = Path(__file__).resolve().parents[3]
KEYS = int(os.environ.get("STATELOG_BOOTSTRAP_KEYS", "3000"))


def test_bootstrap_on_the_cluster_into_s3(s3_server: S3Server, standalone_cluster: cluster.SparkCluster,
                                          tmp_path: Path) -> None:
    root = f"s3://{s3_server.bucket}/bootstrap-{uuid.uuid4().hex}"
    args, out = tmp_path / "args.json", tmp_path / "out.json"
    args.write_text(json.dumps({"master": standalone_cluster.master_url, "root": root, "keys": KEYS, "out": str(out)}))
    run = subprocess.run([sys.executable, "-m", "tests.support.spark.bootstrap_driver", str(args)], cwd=REPO,
                         env=cluster.driver_env(s3_server), capture_output=True, timeout=1800)
    assert run.returncode == 0 and out.exists(), run.stderr.decode(errors="replace")[-5000:]
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    assert result["rows"] == 2 * KEYS + 2 * len(range(0, KEYS, 3))
    with open_root(root, s3_server.options()) as r:
        report = verify_root(r)
    assert report.ok and report.savepoints == ["boot"], report.faults
    infos = bootstrap_driver.infos()
    got: dict[str, dict[str, object]] = {s: {} for s in infos}
    with statelog.open(root, store_options=s3_server.options(), create=False) as job:
        for i in range(3):
            b = job.backend(bootstrap_driver.OPERATOR, subtask=i, parallelism=3, restore="savepoint:boot",
                            changelog=False, clock=lambda: FAR_PAST_MS)
            for s, info in infos.items():
                b.get_state(descriptor_of(info))
                got[s].update({k: v for k, _ns, v in b.entries(s)})
            b.close()
    for s in infos:
        want = {f"u{k}": bootstrap_driver.value_of(k)[s] for k in range(KEYS) if s in bootstrap_driver.value_of(k)}
        assert got[s] == want, s
