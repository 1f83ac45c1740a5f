"""Local copies in recovery (statelog.store.local_copies): a restore after SIGKILL reads
nothing the killed process wrote from the store; misses are copied for the next restore; a
disk that refuses copies costs speed only; metadata and leases never come from copies; the
figures reach the loop's metrics."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
import urllib.request
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from statelog import ValueStateDescriptor
from statelog.layout import (
    JOB_KEY,
    ObjectKind,
    checkpoint_key,
    lease_generation_key,
    parse_key,
)
from statelog.store import open_store
from statelog.store.local_copies import (
    COPIED_KINDS,
    DIRECTORY_ENV,
    SIDECAR,
    LocalCopies,
    LocalCopyStore,
    local_copies_setting,
)
from statelog.testing import FaultInjectingStore

SEG = "changelog/1700000000000-0123456789ab/0000000001.seg"
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)

# the killed process: writes, checkpoints, materializes (tables and manifest written through
# the same copies), writes a tail, checkpoints again, says READY and waits to be killed
WRITER = textwrap.dedent("""
    import sys, time
    import pyarrow as pa
    import statelog
    from materializer.build import materialize
    root, copies = sys.argv[1], sys.argv[2]
    count = statelog.ValueStateDescriptor("count", pa.int64(), default=0)
    with statelog.open(root, max_parallelism=16, writer_lease_ttl_s=1.0,
                       local_copies={"directory": copies, "budget_bytes": 1 << 26}) as job:
        b = job.backend("op")
        state = b.get_state(count)
        for i in range(2000):
            b.set_current_key(i)
            state.update(i)
        materialize(job.store, job.checkpoint())
        for i in range(0, 2000, 7):
            b.set_current_key(i)
            state.update(-i)
        job.checkpoint()
        print("READY", flush=True)
        time.sleep(600)
""")


def test_a_restore_after_sigkill_reads_no_data_object_the_killed_process_wrote(tmp_path: Path) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, root, str(copies)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[3])  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY", proc.communicate(timeout=30)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    setting = {"directory": str(copies), "budget_bytes": 1 << 26}
    # the successor takes the root (after the dead writer's lease ran out) and restores eagerly
    with statelog.open(root, writer_lease_ttl_s=1.0, on_demand_restore=False, local_copies=setting) as job:
        b = job.backend("op", restore="latest")
        state = b.get_state(COUNT)
        for i in (0, 1, 7, 1999):
            b.set_current_key(i)
            assert state.value() == (-i if i % 7 == 0 else i)
        assert job.local_copies is not None
        st = job.local_copies.stats
        assert st.misses == 0 and st.bytes_remote == 0, st
        assert st.hits >= 3  # a manifest, its table(s) and the tail's segment(s), all local


def test_whole_reads_that_miss_are_copied_so_the_next_restore_on_this_host_hits(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    with statelog.open(root, max_parallelism=8) as job:  # no copies: nothing on this host
        b = job.backend("op")
        state = b.get_state(COUNT)
        for i in range(200):
            b.set_current_key(i)
            state.update(i)
        job.checkpoint()
    setting = {"directory": str(tmp_path / "copies"), "budget_bytes": 1 << 24}
    for attempt in range(2):
        with statelog.open(root, on_demand_restore=False, local_copies=setting) as job:
            b = job.backend("op", restore="latest")
            b.set_current_key(42)
            assert b.get_state(COUNT).value() == 42
            st = job.local_copies.stats if job.local_copies is not None else None
            assert st is not None
            if attempt == 0:
                assert st.misses > 0 and st.hits == 0 and st.copies_made == st.misses
            else:  # the first restore's misses were copied
                assert st.misses == 0 and st.hits > 0


def test_a_ranged_read_that_misses_is_served_from_the_store_and_not_copied(tmp_path: Path) -> None:
    inner = FaultInjectingStore(open_store((tmp_path / "root").as_uri()))
    inner.put(SEG, b"0123456789")
    store = LocalCopyStore(inner, LocalCopies(tmp_path / "copies", inner.url))
    assert store.get_range(SEG, 2, 3) == b"234"
    assert not (store.copies.base / SEG).exists() and store.copies.stats.misses == 1
    assert store.get(SEG) == b"0123456789"  # a whole read copies it
    assert store.get_range(SEG, 2, 3) == b"234" and inner.calls["get_range"] == 1


def test_a_disk_that_refuses_a_copy_costs_speed_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    inner = FaultInjectingStore(open_store((tmp_path / "root").as_uri()))
    store = LocalCopyStore(inner, LocalCopies(tmp_path / "copies", inner.url))
    # where the copies of segments go is a file: every copy fails, as on a full disk (this runs
    # as root too, which a read-only directory would not stop)
    (store.copies.base / "changelog").write_text("in the way")
    with caplog.at_level(logging.WARNING, logger="statelog.store.local_copies"):
        store.put(SEG, b"segment")  # the write succeeds
    assert inner.get(SEG) == b"segment"
    assert store.copies.stats.skipped == 1 and store.copies.size_bytes == 0
    assert "could not keep a local copy" in caplog.text
    assert store.get(SEG) == b"segment" and inner.calls["get"] == 2  # from the store, and not copied again
    assert store.copies.stats.skipped == 2
    assert [p.name for p in store.copies.base.rglob("*") if p.is_file()] == ["changelog"]


def test_a_budget_of_zero_copies_nothing_and_writes_succeed(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    setting = {"directory": str(tmp_path / "copies"), "budget_bytes": 0}
    with statelog.open(root, max_parallelism=8, local_copies=setting) as job:
        b = job.backend("op")
        b.set_current_key(1)
        b.get_state(COUNT).update(5)
        job.checkpoint()
        assert job.local_copies is not None and job.local_copies.size_bytes == 0
    assert not [p for p in (tmp_path / "copies").rglob("*") if p.is_file()]


def test_metadata_and_leases_are_never_served_from_copies(tmp_path: Path) -> None:
    inner = FaultInjectingStore(open_store((tmp_path / "root").as_uri()))
    store = LocalCopyStore(inner, LocalCopies(tmp_path / "copies", inner.url))
    others = [JOB_KEY, checkpoint_key(3), lease_generation_key("_leases/writer/", 1)]
    for key in others:
        store.put(key, b"{}")
        assert store.get(key) == b"{}" and store.get_range(key, 0, 1) == b"{"
    assert inner.calls["get"] == len(others) and inner.calls["get_range"] == len(others)
    # and a whole job's run copies only the write-once data kinds
    setting = {"directory": str(tmp_path / "job-copies"), "budget_bytes": 1 << 24}
    with statelog.open((tmp_path / "job").as_uri(), max_parallelism=8, local_copies=setting) as job:
        b = job.backend("op")
        b.set_current_key(1)
        b.get_state(COUNT).update(5)
        job.checkpoint()
        base = job.local_copies.base if job.local_copies is not None else None
    assert base is not None
    kept = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() and p.suffix != SIDECAR]
    assert kept and all((k := parse_key(key)) is not None and k.kind in COPIED_KINDS for key in kept), kept


def test_a_directory_over_its_budget_is_trimmed_by_the_next_process(tmp_path: Path) -> None:
    first = LocalCopies(tmp_path / "copies", "file:///x", 1000)
    second = LocalCopies(tmp_path / "copies", "file:///x", 1000)  # shares the directory
    for i, copies in enumerate((first, second, first, second)):
        copies.add(SEG.replace("0000000001", f"{i:010d}"), b"x" * 400)
    on_disk = sum(p.stat().st_size for p in first.base.rglob("*.seg"))
    assert on_disk == 1600  # each process kept within its own account
    third = LocalCopies(tmp_path / "copies", "file:///x", 1000)
    assert third.size_bytes <= 1000 and third.stats.evictions == 2
    assert sum(p.stat().st_size for p in first.base.rglob("*.seg")) == third.size_bytes


def test_the_loops_metrics_show_the_local_copies(tmp_path: Path) -> None:
    setting = {"directory": str(tmp_path / "copies"), "budget_bytes": 1 << 24}
    with statelog.open((tmp_path / "root").as_uri(), max_parallelism=8, local_copies=setting,
                       metrics_port=0) as job:  # fmt: skip
        b = job.backend("op")
        b.set_current_key(1)
        b.get_state(COUNT).update(5)
        materialize(job.store, job.checkpoint())  # (its table of int keys: a table image too)
        assert job.metrics.url is not None
        with urllib.request.urlopen(job.metrics.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
    made = [line for line in text.splitlines() if line.startswith("statelog_job_local_copies_made_total{")]
    assert made and float(made[0].split()[-1]) >= 1, made
    images = [line for line in text.splitlines() if line.startswith("statelog_job_local_copies_images_made_total{")]
    assert images and float(images[0].split()[-1]) >= 1, images
    for name in ("local_copies_hits_total", "local_copies_misses_total", "local_copies_evictions_total",
                 "local_copies_bytes{", "local_copies_budget_bytes{", "local_copies_image_hits_total"):  # fmt: skip
        assert f"statelog_job_{name}" in text, name
    budget = [line for line in text.splitlines() if line.startswith("statelog_job_local_copies_budget_bytes{")]
    assert float(budget[0].split()[-1]) == 1 << 24


def test_the_default_directory_is_resolved_by_the_process_that_opens_the_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a checked setting carries no directory of the process that checked it (a Spark driver),
    # so each executor's worker uses its own host's directory
    assert local_copies_setting(True) == {"directory": None, "budget_bytes": 1 << 30}
    assert local_copies_setting({"budget_bytes": 5}) == {"directory": None, "budget_bytes": 5}
    monkeypatch.setenv(DIRECTORY_ENV, str(tmp_path / "host-copies"))
    with statelog.open((tmp_path / "root").as_uri(), max_parallelism=8, local_copies=True) as job:
        assert job.local_copies is not None
        assert job.local_copies.base.parent == tmp_path / "host-copies"


def test_rescaling_reads_the_copies_there_are_and_fetches_the_rest(tmp_path: Path) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    setting = {"directory": str(copies), "budget_bytes": 1 << 26}
    m = 16
    with statelog.open(root, max_parallelism=m, local_copies=setting) as job:
        old = [job.backend("op", subtask=i, parallelism=2) for i in range(2)]
        states = [b.get_state(COUNT) for b in old]
        for k in range(600):
            s = statelog.subtask_for_key_group(m, 2, statelog.key_group_of(k, m))
            old[s].set_current_key(k)
            states[s].update(k)
            if k % 200 == 199:  # a segment per checkpoint
                job.checkpoint()
    kept = sorted(p for p in copies.rglob("*.seg"))
    assert len(kept) >= 3
    for p in kept[::2]:  # this host lost some of its copies
        p.unlink()
        p.with_name(p.name + SIDECAR).unlink()
    for attempt in range(2):
        with statelog.open(root, on_demand_restore=False, local_copies=setting) as job:
            for i in range(3):  # 2 -> 3: each new subtask reads parts of both old subtasks' changelogs
                b = job.backend("op", subtask=i, parallelism=3, restore="latest", changelog=False)
                state = b.get_state(COUNT)
                mine = [k for k in range(600) if statelog.subtask_for_key_group(m, 3, statelog.key_group_of(k, m)) == i]
                for k in mine[:20]:
                    b.set_current_key(k)
                    assert state.value() == k
            st = job.local_copies.stats if job.local_copies is not None else None
            assert st is not None
            if attempt == 0:  # the copies there were served, the lost ones fetched (and copied)
                assert st.hits > 0 and st.misses > 0 and st.copies_made == st.misses, st
            else:
                assert st.misses == 0 and st.hits > 0, st


def test_copies_that_do_not_match_what_references_them_are_dropped_even_with_a_consistent_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    setting = {"directory": str(copies), "budget_bytes": 1 << 26}
    with statelog.open(root, max_parallelism=8, local_copies=setting) as job:
        b = job.backend("op")
        state = b.get_state(COUNT)
        for k in range(100):
            b.set_current_key(k)
            state.update(k)
        materialize(job.store, job.checkpoint())
        job.adopt_latest_materialization(max_age_s=0.0)
        b.set_current_key(1000)
        state.update(1)
        job.checkpoint()  # builds on the materialization: a restore reads its tables
    for image in copies.rglob("*.image*"):  # (the tables' decoded copies: a restore would read those instead)
        image.unlink()
    tables = sorted(copies.rglob("*.parquet"))
    (base,) = copies.iterdir()  # the root's directory
    manifests = [p for p in base.rglob("*.json")
                 if (k := parse_key(p.relative_to(base).as_posix())) is not None and k.kind is ObjectKind.MANIFEST]
    assert tables and len(manifests) == 1
    for p in tables + manifests:  # other bytes under a record that matches them: only the reference can tell
        other = p.read_bytes()[::-1]
        p.write_bytes(other)
        p.with_name(p.name + SIDECAR).write_text(f"{len(other)} {zlib.crc32(other)}")
    with caplog.at_level(logging.WARNING, logger="statelog.store.local_copies"), \
            statelog.open(root, on_demand_restore=False, local_copies=setting) as job:  # fmt: skip
        b = job.backend("op", restore="latest")
        state = b.get_state(COUNT)
        for k in (0, 5, 99):
            b.set_current_key(k)
            assert state.value() == k
        st = job.local_copies.stats if job.local_copies is not None else None
        assert st is not None and st.dropped == len(tables) + 1 and st.misses >= len(tables) + 1, st
    assert "the object that references it records" in caplog.text
