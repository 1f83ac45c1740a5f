"""The engine starts no materializer: ``materializer.start_background(job)`` does, and
``statelog`` imports nothing from the packages above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa

import materializer
import statelog
from statelog import ValueStateDescriptor
from statelog.job import StateJob

REPO = Path(__file__).resolve().parents[2]


def test_the_engine_imports_nothing_from_the_packages_above_it():
    found = []
    for path in sorted((REPO / "statelog").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(REPO)}: {n}" for n in names
                      if n.split(".")[0] in ("materializer", "runtime", "tools")]
    assert found == []


def test_start_background_is_the_materializer_packages(tmp_path):
    assert not hasattr(StateJob, "start_materializer")
    job = statelog.open(tmp_path.as_uri())
    try:
        b = job.backend("op")
        v = b.get_state(ValueStateDescriptor("v", pa.int64()))
        for k in range(20):
            b.set_current_key(k)
            v.update(k * 2)
        with materializer.start_background(job, interval_s=3600.0, run_gc=False) as bg:
            meta = job.checkpoint()
            bg.trigger(timeout=30)
        assert not bg.running
        m = job.latest_materialization()
        assert m is not None and m.checkpoint_id == meta.checkpoint_id
    finally:
        job.close()
