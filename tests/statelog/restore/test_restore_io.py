"""Restore I/O lives in statelog/restore/: reading a checkpoint's handles (manifests, state
tables, changelog tail) apart from the backend that turns them into state."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa

import statelog
import statelog.state.backend
from materializer.build import materialize
from statelog.changelog.reader import SegmentReader
from statelog.keys.groups import KeyGroupRange, key_group_range_for_subtask
from statelog.restore.changes import RestoredChanges, base_entries
from statelog.restore.eager import read_changes

REPO = Path(__file__).resolve().parents[3]


def test_the_backend_reads_no_handle_itself() -> None:
    assert RestoredChanges.__module__ == "statelog.restore.changes"
    assert base_entries.__module__ == "statelog.restore.changes"
    tree = ast.parse((REPO / "statelog" / "state" / "backend.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    assert not defined & {"RestoredChanges", "base_entries", "gc_paused"}
    imported = {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not {m for m in imported if m.startswith("statelog.changelog.reader")
                or m.endswith((".load_manifest", ".read_table_file"))}


def test_restored_changes_read_the_base_and_the_tail_of_the_requested_key_groups(tmp_path: Path) -> None:
    with statelog.open(tmp_path.as_uri(), max_parallelism=16) as job:
        b = job.backend("op")
        v = b.get_state(statelog.ValueStateDescriptor("v", pa.int64()))
        for k in range(100):
            b.set_current_key(k)
            v.update(k)
        base = job.checkpoint()
        m = materialize(job.store, base)
        for k in range(40):  # the tail after the materialization the next checkpoint adopts
            b.set_current_key(k)
            v.update(-k)
        meta = job.checkpoint()
        handles = list(meta.operators["op"].subtasks)
        assert [p.manifest for h in handles for p in h.materialization] == [m.key]
        whole = read_changes(SegmentReader(job.store), handles, KeyGroupRange(0, 15), job_id=job.job_id)
        half = key_group_range_for_subtask(16, 2, 0)
        part = read_changes(SegmentReader(job.store), handles, half, job_id=job.job_id)
    assert whole.base_checkpoint_id == base.checkpoint_id and whole.base_rows == 100
    assert whole.records_read == 40 and len(whole.records["v"]) == 40
    assert 0 < part.base_rows < 100 and 0 < part.records_read < 40
    assert all(p.key_groups == half for p in part.parts)
    keys, _nss, values = base_entries(whole.infos["v"], pa.concat_tables(whole.base["v"]))
    assert dict(zip(keys, values, strict=True)) == {k: k for k in range(100)}
