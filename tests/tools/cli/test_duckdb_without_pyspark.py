"""``statelog sql`` and ``statelog inspect`` on DuckDB run without PySpark (and so without Java).

The commands run as the console script does, in a fresh interpreter whose ``PYTHONPATH``
starts with a directory holding a ``pyspark`` package that records the attempt to import it
and raises ``ImportError``: an installation without the ``spark`` extra, which also shows
whether anything on the DuckDB path so much as tries to import PySpark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

REPO = Path(__file__).resolve().parents[3]
BLOCKER = """\
import os
with open(os.environ["PYSPARK_IMPORT_ATTEMPTS"], "a") as f:
    f.write(__name__ + "\\n")
raise ImportError("pyspark is not installed here")
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two checkpoints of ``op`` (value, list and map states, event timers), the first materialized."""
    url = (tmp_path_factory.mktemp("nospark") / "root").as_uri()
    job = statelog.open(url, max_parallelism=8)
    b = job.backend("op")
    count = b.get_state(ValueStateDescriptor("count", pa.int64()))
    seen = b.get_state(ListStateDescriptor("seen", pa.string()))
    attrs = b.get_state(MapStateDescriptor("attrs", pa.int64(), key_type=pa.string()))
    for round_ in range(2):
        for n in range(4):
            b.set_current_key(f"k{n}")
            count.update(10 * round_ + n)
            seen.add(f"e{round_}")
            attrs.put("round", round_)
            b.timers.register_event_time_timer(1000 * (round_ + 1) + n)
        meta = job.checkpoint(sources={"round": round_})
        if round_ == 0:
            materialize(job.store, meta)
    job.close()
    return url


def cli(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``python -m tools.cli ARGV`` where PySpark cannot be imported; also the import attempts."""
    blocked = tmp_path / "no-pyspark"
    (blocked / "pyspark").mkdir(parents=True, exist_ok=True)
    (blocked / "pyspark" / "__init__.py").write_text(BLOCKER)
    attempts = tmp_path / "attempts.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked), str(REPO)]),
           "PYSPARK_IMPORT_ATTEMPTS": str(attempts), "COLUMNS": "200"}
    env.pop("STATELOG_SPARK_MASTER", None)
    proc = subprocess.run([sys.executable, "-m", "tools.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    return proc, attempts.read_text().splitlines() if attempts.exists() else []


def test_the_blocker_blocks(tmp_path: Path) -> None:
    proc, attempts = cli(tmp_path, "sql", "file:///nowhere", "SELECT 1", "--engine", "spark")
    assert proc.returncode == 2 and attempts == ["pyspark"], (proc.stderr, attempts)
    assert proc.stderr.startswith("statelog: error: statelog.spark needs PySpark") and proc.stderr.count("\n") == 1


def test_sql_on_duckdb_without_pyspark(root: str, tmp_path: Path) -> None:
    query = ("SELECT key, c.value AS count, s.value AS seen, a.value['round'] AS r FROM op__count c "
             "JOIN op__seen s USING (key) JOIN op__attrs a USING (key) ORDER BY key")
    proc, attempts = cli(tmp_path, "sql", root, query, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [{"key": f"k{n}", "count": 10 + n, "seen": ["e0", "e1"], "r": 1}
                                       for n in range(4)]
    proc, more = cli(tmp_path, "sql", root, "SELECT count(*) AS n FROM op__timers_event", "--json",
                     "--checkpoint", "1")
    assert proc.returncode == 0 and json.loads(proc.stdout) == [{"n": 4}], proc.stderr
    proc, feed = cli(tmp_path, "sql", root, "SELECT key, value FROM op__count__changes ORDER BY key", "--json",
                     "--changes-from", "1")
    assert proc.returncode == 0 and json.loads(proc.stdout) == [{"key": f"k{n}", "value": 10 + n} for n in range(4)]
    proc, meta = cli(tmp_path, "sql", root, "SELECT checkpoint_id, timestamp, operators FROM statelog_checkpoints",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    assert [(r["checkpoint_id"], r["operators"]) for r in json.loads(proc.stdout)] == [(1, ["op"]), (2, ["op"])]
    assert attempts == more == feed == meta == [], "the DuckDB engine tried to import PySpark"


@pytest.mark.parametrize("extra", [[], ["--no-count"], ["--json"]], ids=["table", "no-count", "json"])
def test_inspect_on_duckdb_without_pyspark(root: str, tmp_path: Path, extra: list[str]) -> None:
    proc, attempts = cli(tmp_path, "inspect", root, *extra)
    assert proc.returncode == 0, proc.stderr
    assert attempts == [], "inspect tried to import PySpark"
    if extra == ["--json"]:
        states = {s["name"]: s for s in json.loads(proc.stdout)["operators"][0]["states"]}
        assert {n: s["rows"] for n, s in states.items()} == {
            "__timers_event": 8, "__timers_processing": 0, "attrs": 4, "count": 4, "seen": 4}
    else:
        assert "op__count" in proc.stdout and "op__attrs" in proc.stdout


@pytest.mark.parametrize("argv", [["sql", "ROOT", "SELECT 1", "--engine", "spark"],
                                  ["inspect", "ROOT", "--master", "local[1]"],
                                  ["restore", "ROOT", "--checkpoint", "latest"]],
                         ids=["sql-spark", "inspect-spark", "restore"])
def test_what_needs_spark_names_the_extra(root: str, tmp_path: Path, argv: list[str]) -> None:
    proc, attempts = cli(tmp_path, *[root if a == "ROOT" else a for a in argv])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "pip install 'statelog[spark]'" in proc.stderr and attempts == ["pyspark"]
