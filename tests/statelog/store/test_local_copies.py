"""Local copies of immutable objects (statelog.store.local_copies): served only when verified,
within their budget, never for metadata; a job restored through them reads nothing it wrote."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import StateJob, ValueStateDescriptor
from statelog.errors import ConfigError
from statelog.store import open_store
from statelog.store.local_copies import SIDECAR, LocalCopies, LocalCopyStore
from statelog.testing import FaultInjectingStore

SEG = "changelog/1700000000000-0123456789ab/0000000001.seg"
CHK = "checkpoints/chk-000000000001.json"
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def copy_store(tmp_path: Path, budget: int = 1 << 20) -> tuple[LocalCopyStore, FaultInjectingStore]:
    inner = FaultInjectingStore(open_store((tmp_path / "root").as_uri()))
    return LocalCopyStore(inner, LocalCopies(tmp_path / "copies", inner.url, budget)), inner


def test_what_a_process_wrote_is_read_back_locally_and_metadata_never(tmp_path: Path) -> None:
    store, inner = copy_store(tmp_path)
    store.put(SEG, b"segment bytes")
    store.put(CHK, b"{}")
    assert store.get(SEG) == b"segment bytes" and store.get_range(SEG, 8, 5) == b"bytes"
    assert store.get_range(SEG, -5, 5) == b"bytes"
    assert inner.calls.get("get", 0) == 0 and inner.calls.get("get_range", 0) == 0
    assert store.get(CHK) == b"{}" and inner.calls["get"] == 1  # metadata: always the store
    assert not (store.copies.base / CHK).exists()
    assert store.copies.stats.as_dict()["hits"] == 3


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "sidecar"])
def test_a_damaged_copy_is_dropped_logged_and_read_from_the_store(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, inner = copy_store(tmp_path)
    store.put(SEG, b"0123456789")
    path = store.copies.base / SEG
    if damage == "flip":
        path.write_bytes(b"0123456788")
    elif damage == "truncate":
        path.write_bytes(b"01234")
    elif damage == "delete":
        path.unlink()
    else:
        path.with_name(path.name + SIDECAR).write_text("garbage")
    with caplog.at_level(logging.WARNING, logger="statelog.store.local_copies"):
        assert store.get(SEG) == b"0123456789"
    assert inner.calls["get"] == 1
    if damage != "delete":
        assert store.copies.stats.dropped == 1 and "dropped the local copy" in caplog.text
    # read from the store, the copy is made again and serves the next read
    assert store.get(SEG) == b"0123456789" and inner.calls["get"] == 1


def test_a_ranged_read_of_a_damaged_copy_goes_to_the_store(tmp_path: Path) -> None:
    store, inner = copy_store(tmp_path)
    store.put(SEG, b"0123456789")
    (store.copies.base / SEG).write_bytes(b"xxxxxxxxxx")
    assert store.get_range(SEG, 2, 3) == b"234" and inner.calls["get_range"] == 1


def test_copies_stay_within_the_budget_least_recently_used_evicted_first(tmp_path: Path) -> None:
    store, inner = copy_store(tmp_path, budget=250)
    keys = [SEG.replace("0000000001", f"{i:010d}") for i in range(1, 5)]
    for k in keys[:2]:
        store.put(k, b"x" * 100)
    store.get(keys[0])  # keys[1] is now the least recently used
    store.put(keys[2], b"y" * 100)
    assert store.copies.size_bytes <= 250 and store.copies.stats.evictions == 1
    assert not (store.copies.base / keys[1]).exists() and (store.copies.base / keys[0]).exists()
    store.put(keys[3], b"z" * 300)  # larger than the budget: not copied at all
    assert not (store.copies.base / keys[3]).exists()
    on_disk = sum(p.stat().st_size for p in store.copies.base.rglob("*.seg"))
    assert on_disk == store.copies.size_bytes <= 250
    # a new process finds the copies (and their total) in the directory
    again = LocalCopies(tmp_path / "copies", inner.url, 250)
    assert again.size_bytes == store.copies.size_bytes and again.get(keys[0]) == b"x" * 100


def test_the_budget_bounds_the_directory_across_roots(tmp_path: Path) -> None:
    """Copies of many roots share one budget: a root that is gone does not keep its copies."""
    keys = [SEG.replace("0000000001", f"{i:010d}") for i in range(1, 4)]
    directory = tmp_path / "copies"
    old_roots = []
    for n in range(3):  # three earlier roots, each 200 bytes of copies, then deleted
        inner = open_store((tmp_path / f"gone{n}").as_uri())
        old = LocalCopyStore(inner, LocalCopies(directory, inner.url, 1000))
        for k in keys[:2]:
            old.put(k, bytes([n]) * 100)
        old_roots.append(old.copies.base)
    # a process opening the directory with a 450-byte budget trims it to the budget, the
    # least recently used copies (of the oldest roots) first
    store, inner = copy_store(tmp_path, budget=450)
    assert store.copies.size_bytes <= 450 and store.copies.stats.evictions == 2
    assert not any(old_roots[0].rglob("*.seg")) and len(list(old_roots[2].rglob("*.seg"))) == 2
    # its own new copies push out the remaining old ones, not each other
    for k in keys:
        store.put(k, b"n" * 100)
    on_disk = sum(p.stat().st_size for p in directory.rglob("*.seg"))
    assert on_disk == store.copies.size_bytes <= 450
    assert all((store.copies.base / k).exists() for k in keys)
    assert len(list(old_roots[2].rglob("*.seg"))) == 1 and not any(old_roots[1].rglob("*.seg"))
    assert store.get(keys[0]) == b"n" * 100 and inner.calls.get("get", 0) == 0


def test_a_restore_reads_nothing_this_host_wrote(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    store, _ = copy_store(tmp_path)
    with StateJob(root, store=store, max_parallelism=8) as job:
        b = job.backend("op")
        counts = b.get_state(COUNT)
        for i in range(500):
            b.set_current_key(f"k{i % 50}")
            counts.update(counts.value() + 1)
        job.checkpoint()
    assert store.copies.stats.copies_made > 0
    again, inner = copy_store(tmp_path)
    with StateJob(root, store=again, max_parallelism=8, create=False) as job:
        b = job.backend("op", restore="latest")
        counts = b.get_state(COUNT)
        b.set_current_key("k7")
        assert counts.value() == 10
    reads = {k for k, n in inner.calls.items() if k in ("get", "get_range") and n}
    assert again.copies.stats.misses == 0 and again.copies.stats.hits > 0, (reads, again.copies.stats)


def test_a_directory_that_cannot_be_used_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot use .* for local copies"):
        LocalCopies(blocker / "copies", "file:///x")
    with pytest.raises(ConfigError, match="budget"):
        LocalCopies(tmp_path / "c", "file:///x", -1)


def test_statelog_open_takes_local_copies_and_a_restarted_loop_restores_from_them(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    setting = {"directory": str(tmp_path / "copies"), "budget_bytes": 1 << 20}
    with statelog.open(root, max_parallelism=8, local_copies=setting) as job:
        assert job.local_copies is not None
        b = job.backend("op")
        counts = b.get_state(COUNT)
        for i in range(300):
            b.set_current_key(i % 30)
            counts.update(counts.value() + 1)
        job.checkpoint()
        made = job.local_copies.stats.copies_made
    assert made > 0
    with statelog.open(root, local_copies=setting) as job:
        b = job.backend("op", restore="latest")
        b.set_current_key(3)
        assert b.get_state(COUNT).value() == 10
        assert job.local_copies is not None and job.local_copies.stats.misses == 0
        assert job.local_copies.stats.hits > 0
    with statelog.open(root) as job:
        assert job.local_copies is None


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"dir": "/tmp/x"}, "unknown local_copies option"),
        (3, "local_copies must be True, False, None, a directory"),
        ({"directory": ""}, "non-empty path"),
        ({"budget_bytes": -5}, "budget"),
    ],
)
def test_bad_local_copies_settings_are_clear_errors(tmp_path: Path, setting: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        statelog.open((tmp_path / "root").as_uri(), local_copies=setting)


def test_a_reopened_store_shares_the_copies(tmp_path: Path) -> None:
    store, _ = copy_store(tmp_path)
    inner = open_store((tmp_path / "root").as_uri())
    plain = LocalCopyStore(inner, store.copies)
    twin = plain.reopen()
    assert isinstance(twin, LocalCopyStore) and twin.copies is store.copies and twin.inner is not inner
    twin.put(SEG, b"written by the twin")
    assert store.copies.get(SEG) == b"written by the twin"
    twin.close()
    assert store.reopen() is None  # a fault injector underneath cannot be reopened
