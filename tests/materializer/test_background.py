"""The background mode lives in materializer/background.py, and the materializer names no
concrete store: it gets an ObjectStore, or opens / reopens one through ``statelog.store``."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa

import materializer
import materializer.daemon.loop
import statelog
from materializer.background import BackgroundMaterializer, start_background
from statelog import ValueStateDescriptor
from statelog.store import open_store, reopen_store
from statelog.testing import FaultInjectingStore

REPO = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module or "")
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_materializer_module_imports_a_concrete_store() -> None:
    found = {
        f"{path.relative_to(REPO)}: {m}"
        for path in sorted((REPO / "materializer").rglob("*.py"))
        for m in imported_modules(path)
        if m.startswith(("statelog.store.local", "statelog.store.s3"))
    }
    assert found == set()


def test_the_background_mode_is_its_own_module() -> None:
    assert materializer.start_background is start_background
    assert materializer.BackgroundMaterializer is BackgroundMaterializer
    assert not hasattr(materializer.daemon.loop, "start_background")
    assert not hasattr(materializer.daemon.loop, "BackgroundMaterializer")


def test_the_background_loop_reopens_the_jobs_store_and_shares_a_wrapper(tmp_path: Path) -> None:
    job = statelog.open(tmp_path.as_uri())
    try:
        b = job.backend("op")
        v = b.get_state(ValueStateDescriptor("v", pa.int64()))
        b.set_current_key(1)
        v.update(2)
        with start_background(job, interval_s=3600.0, run_gc=False) as bg:
            assert bg.daemon.store is not job.store and bg.daemon.store.url == job.store.url
            meta = job.checkpoint()
            bg.trigger(timeout=30)  # materialized by the forced cycle, or by an unforced one before it
        assert job.latest_materialization().checkpoint_id == meta.checkpoint_id  # type: ignore[union-attr]
        faulty = FaultInjectingStore(job.store)
        assert reopen_store(faulty) is None
        with start_background(faulty, interval_s=3600.0, run_gc=False) as bg:
            assert bg.daemon.store is faulty
    finally:
        job.close()
    with open_store(tmp_path.as_uri()) as store:
        twin = reopen_store(store)
        assert twin is not None and twin is not store and twin.url == store.url
        assert {o.key for o in twin.list()} == {o.key for o in store.list()}
