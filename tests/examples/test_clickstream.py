"""The clickstream demo end to end, as ``make demo`` runs it, on a smaller input.

A parallel runtime job loses a worker (SIGKILL) once half of its input is checkpointed; the
committed outputs must equal the plain-Python expectation exactly once, and Spark SQL over
the state at two checkpoints must equal the counts implied by their source positions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def test_clickstream_demo_kills_a_worker_and_verifies_exactly_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "examples.clickstream", "--json", "--events", "60000",
            "--users", "800", "--rate", "12000", "--materialize-every", "1", "--dir", str(tmp_path),
        ],  # fmt: skip
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}); stderr:\n{proc.stderr[-3000:]}"
    r = json.loads(lines[-1])
    assert proc.returncode == 0 and r["passed"], json.dumps({k: v for k, v in r.items() if k != "checkpoints_list"}, indent=1)
    assert r["kill"]["happened"] and r["kill"]["covered"] >= 0.5
    assert r["attempts"] == 2 and any("WorkerLostError" in f for f in r["failures"])
    for out in r["outputs"]:
        assert out["records"] == out["expected"] > 0
        assert out["duplicates"] == out["missing"] == out["unexpected"] == 0
    assert r["manifests"], "the background materializer published nothing"
    sql = r["spark_sql"]["checkpoints"]
    assert len(sql) == 2 and all(c["passed"] for c in sql.values())
    early, final = (sql[str(r["kill"]["after_checkpoint"])], sql[str(r["final_checkpoint"])])
    assert early["clicks"] < final["clicks"] == r["events"] == 60000
    assert "user-counts" in r["checkpoints_list"]
