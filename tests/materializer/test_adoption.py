"""Backends adopting materializations: lineage, pending snapshots, pickling of state types."""

from __future__ import annotations

import pickle

import pyarrow as pa

import statelog
from materializer.build import materialize
from statelog import ValueStateDescriptor
from statelog.types import PICKLE

COUNT = ValueStateDescriptor("c", pa.int64(), default=0)


def _fill(job: statelog.StateJob, b, keys: range) -> None:
    st = b.get_state(COUNT)
    for k in keys:
        b.set_current_key(k)
        st.update(k)
        job.writer.flush()  # one segment per record: adoption drops whole segments


def _restored_keys(root: str, cid: int) -> int:
    with statelog.open(root) as job:
        b = job.backend("op", restore=cid, changelog=False)
        b.get_state(COUNT)
        return sum(1 for _ in b.entries("c"))


def test_adoption_while_a_snapshot_is_pending_keeps_that_snapshot_complete(tmp_path):
    root = tmp_path.as_uri()
    job = statelog.open(root, writer_options={"persist_delay": 0.001})
    job.materialization_poll_s = 0
    b = job.backend("op")
    _fill(job, b, range(50))
    m = materialize(job.store, job.checkpoint())
    _fill(job, b, range(50, 100))
    pending = b.snapshot(2)  # sealed on the old base: it needs the segments before m
    assert b.adopt_materialization(m)
    job.publish_checkpoint(2, [pending.result()], {})
    assert _restored_keys(root, 2) == 100
    h3 = b.snapshot(3).result()  # built on m: only the 50 records after it
    assert [p.manifest for p in h3.materialization] == [m.key]
    assert [(r.start, r.end) for r in h3.changelog if r.stream.endswith("/c")] == [(50, 100)]
    job.publish_checkpoint(3, [h3], {})
    assert _restored_keys(root, 3) == 100
    job.close()


def test_a_materialization_outside_the_lineage_is_not_adopted(tmp_path):
    """A backend restored from checkpoint 1 must not build on a materialization of checkpoint 2
    taken by an earlier run: it holds changes the restored backend never saw."""
    root = tmp_path.as_uri()
    job = statelog.open(root)
    job.materialization_poll_s = 0
    b = job.backend("op")
    _fill(job, b, range(10))
    c1 = job.checkpoint()
    _fill(job, b, range(10, 20))
    c2 = job.checkpoint()
    materialize(job.store, c2)
    job.close()
    job = statelog.open(root)
    job.materialization_poll_s = 0
    b = job.backend("op", restore=c1.checkpoint_id)
    b.get_state(COUNT)
    b.wait_loaded()  # (a backend still loading on demand adopts nothing, lineage or not)
    c3 = job.checkpoint()
    assert all(not h.materialization for op in c3.operators.values() for h in op.subtasks)
    assert _restored_keys(root, c3.checkpoint_id) == 10
    m3 = materialize(job.store, c3)  # its own checkpoint: adopted at the next checkpoint
    c4 = job.checkpoint()
    assert [p.manifest for op in c4.operators.values() for h in op.subtasks for p in h.materialization] == [m3.key]
    assert _restored_keys(root, c4.checkpoint_id) == 10
    job.close()


def test_pickle_marker_survives_pickling():
    assert pickle.loads(pickle.dumps(PICKLE)) is PICKLE
    info = statelog.descriptors.StateInfo("s", statelog.descriptors.StateKind.VALUE, PICKLE, None, None)
    assert pickle.loads(pickle.dumps(info)).value_type is PICKLE


def test_a_corrupt_newest_manifest_is_not_adopted_and_the_checkpoint_still_publishes(tmp_path):
    """The job never depends on the materializer: a newest manifest that fails verification
    is logged and skipped; the checkpoint keeps the current base and restores exactly."""
    import logging

    root = tmp_path.as_uri()
    job = statelog.open(root)
    job.materialization_poll_s = 0
    b = job.backend("op")
    _fill(job, b, range(20))
    m1 = materialize(job.store, job.checkpoint())
    _fill(job, b, range(20, 40))
    c2 = job.checkpoint()  # adopts m1
    m2 = materialize(job.store, c2)
    path = tmp_path / m2.key
    path.write_bytes(path.read_bytes().replace(b'"checkpoint_id"', b'"checkpoint_iX"', 1))
    _fill(job, b, range(40, 60))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("statelog.job").addHandler(handler)
    try:
        c3 = job.checkpoint()
    finally:
        logging.getLogger("statelog.job").removeHandler(handler)
    assert any(m2.key in r.getMessage() and r.levelno == logging.ERROR for r in records)
    parts = {p.manifest for h in c3.operators["op"].subtasks for p in h.materialization}
    assert parts == {m1.key}
    job.close()
    assert _restored_keys(root, c3.checkpoint_id) == 60
