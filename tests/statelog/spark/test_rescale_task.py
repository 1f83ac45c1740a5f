"""One task of the restore job, without Spark: it writes the new subtask's state tables with
the engine's table writer and nothing else (the driver writes the one manifest)."""

from __future__ import annotations

import pyarrow as pa

import statelog
from statelog import ListStateDescriptor, ValueStateDescriptor
from statelog.layout import SAVEPOINT_PREFIX
from statelog.materialization.manifest import MaterializedOperator
from statelog.materialization.table_reader import read_table_file
from statelog.spark.rescale.plan import plan_restore
from statelog.spark.rescale.write import run_task


def test_a_restore_task_writes_only_its_tables(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    try:
        b = job.backend("op")
        v = b.get_state(ValueStateDescriptor("v", pa.int64()))
        lst = b.get_state(ListStateDescriptor("l", pa.string()))
        for k in range(50):
            b.set_current_key(k)
            v.update(k)
            lst.add(f"x{k}")
        meta = job.checkpoint()
        tasks = plan_restore(meta, 3)
        assert len(tasks) == 3
        results = [run_task(job.root, None, "sp", t) for t in tasks]
        assert all("error" not in r for r in results), results
        keys = sorted(o.key for o in job.store.list(SAVEPOINT_PREFIX))
        assert keys and all(k.startswith(f"{SAVEPOINT_PREFIX}sp/data/") and k.endswith(".parquet") for k in keys)
        rows = {"v": 0, "l": 0}
        for t, r in zip(tasks, results, strict=True):
            mop = MaterializedOperator.from_json("op", r["operator"])
            infos = {i.name: i for i in mop.states}
            for name, files in mop.files.items():
                for f in files:
                    assert f.key_groups.start >= t.handle["key_groups"][0]
                    rows[name] += read_table_file(job.store, f, f.key_groups, infos[name]).num_rows
            assert r["stats"]["files_written"] == sum(len(fs) for fs in mop.files.values())
        assert rows == {"v": 50, "l": 50}
    finally:
        job.close()


def test_restore_tasks_read_the_local_copies_on_their_host_and_fetch_the_rest(tmp_path):
    copies = tmp_path / "copies"
    setting = {"directory": str(copies), "budget_bytes": 1 << 26}
    with statelog.open((tmp_path / "root").as_uri(), local_copies=setting) as job:
        b = job.backend("op")
        v = b.get_state(ValueStateDescriptor("v", pa.int64()))
        for k in range(300):
            b.set_current_key(k)
            v.update(k)
            if k % 100 == 99:
                meta = job.checkpoint()
        root = job.root
    segments = sorted(copies.rglob("*.seg"))
    assert len(segments) >= 3
    segments[0].unlink()  # one copy this host lost
    tasks = plan_restore(meta, 2)
    results = [run_task(root, None, "sp", t, local_copies=setting) for t in tasks]
    assert all("error" not in r for r in results), results
    figures = [r["local_copies"] for r in results]
    assert sum(f["hits"] for f in figures) > 0
    assert 0 < sum(f["misses"] for f in figures) <= len(tasks)  # only the lost copy, fetched once per task
    assert all(f["bytes_remote"] < f["bytes_local"] for f in figures)
    assert all("local_copies" not in r for r in [run_task(root, None, "sp2", t) for t in tasks])
