"""``python -m bench startup`` with small sizes: every figure is there, with its spread and
the import profile (timings are not asserted: the machine's load decides them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.startup_loop import STEPS
from tests.support.kafka.broker import KafkaBroker

REPO = Path(__file__).resolve().parents[2]
FIGURES = ("import_statelog_s", "cli_help_s", "checkpoints_list_s", "restart_first_record_s")


def test_startup_benchmark_prints_its_figures(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "startup", "--quick", "--json", "--rounds", "2", "--breakdown",
         "--bootstrap", kafka_broker.bootstrap_servers, "--root", tmp_path.as_uri()],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["rounds"] == 2
    for name in FIGURES:
        assert result[name] > 0, name
        assert result[name.removesuffix("_s") + "_spread"] >= 0, name
    assert result["restart_pandas_loaded_at_first_record"] == 0
    assert result["bytecode_cache"] == "prefix"
    steps = result["restart_breakdown"]
    assert set(steps) == {*STEPS, "process_cpu"} and all(v >= 0 for v in steps.values()), steps
    assert sum(steps[s] for s in STEPS) == pytest.approx(result["restart_first_record_s"], rel=0.5)
    profile = result["import_profile"]
    loop_packages = {name for name, _ in profile["consumer_loop_imports"]["top"]}
    assert "pyarrow" in loop_packages and profile["import_statelog"]["total_s"] > 0
    assert not {"pandas", "duckdb", "plotly", "rocksdict"} & {n for n, _ in profile["import_statelog"]["top"]}


def test_rounds_applies_to_the_startup_benchmark_only() -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "kafka", "--rounds", "2"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "--rounds applies to the startup benchmark only" in out.stderr
