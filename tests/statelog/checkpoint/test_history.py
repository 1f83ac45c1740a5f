"""The checkpoint history (statelog/checkpoint/history.py): every checkpoint beyond retention,
failed ones included, in rolled and verified segments of bounded number."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog.checkpoint.history import CheckpointHistory, read_history
from statelog.errors import StoreError
from statelog.layout import HISTORY_PREFIX, history_segment_key
from statelog.store import open_store
from statelog.store.base import ObjectStore
from statelog.testing import FaultInjectingStore
from tests.support.wait import wait_until

COUNT = statelog.ValueStateDescriptor("count", pa.int64())


def _count(job: statelog.StateJob, keys: range) -> None:
    b = job.backend("op") if not job._backends else job._backends[0]
    s = b.get_state(COUNT)
    for k in keys:
        b.set_current_key(k)
        s.update((s.value() or 0) + 1)


def test_every_checkpoint_is_kept_beyond_retention(tmp_path: Path) -> None:
    url = (tmp_path / "root").as_uri()
    with statelog.open(url, retain_checkpoints=2) as job:
        for i in range(7):
            _count(job, range(i * 10, i * 10 + 5))
            job.checkpoint(sources={"src": i})
        assert len(job.catalog.checkpoint_ids()) == 2
    read = read_history(open_store(url))  # written at the latest when the job closed
    assert read.errors == []
    done = [e for e in read.entries if e["status"] == "completed"]
    assert [e["checkpoint_id"] for e in done] == list(range(1, 8))
    first, later = done[0], done[1:]
    assert "delta_changes" not in first  # nothing known before this process's first checkpoint
    assert all(e["delta_changes"] == 5 for e in later), [e["delta_changes"] for e in later]
    assert all(e["sync_ms"] >= 0 and e["incremental_bytes"] > 0 and e["timestamp_ms"] > 0 for e in done)


class _FailingPuts(ObjectStore):
    """A store whose puts below one prefix fail (a real local store underneath)."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        self.inner, self.prefix, self.url = inner, prefix, inner.url

    def put(self, key: str, data: bytes) -> None:
        if key.startswith(self.prefix):
            raise StoreError(f"refused put of {key}")
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self.inner.get_range(key, offset, length)

    def head(self, key: str):  # type: ignore[no-untyped-def]
        return self.inner.head(key)

    def list(self, prefix: str = ""):  # type: ignore[no-untyped-def]
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def test_a_failing_history_append_never_fails_the_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = (tmp_path / "root").as_uri()
    with statelog.open(url) as job:
        job._checkpoints.history.store = _FailingPuts(job.store, HISTORY_PREFIX)
        _count(job, range(3))
        with caplog.at_level(logging.WARNING, logger="statelog.checkpoint.history"):
            meta = job.checkpoint()
            job.checkpoint_history.flush()
        assert meta.checkpoint_id == 1 and job.catalog.checkpoint_ids() == [1]
        assert job.checkpoint_history.errors == 1
        assert any("could not record completed" in r.getMessage() for r in caplog.records)


def test_a_failed_checkpoint_is_recorded_with_its_reason(tmp_path: Path) -> None:
    url = (tmp_path / "root").as_uri()
    with statelog.open(url) as job:
        _count(job, range(3))
        job.checkpoint()
        _count(job, range(3))
        real = job.store
        job.catalog.store = _FailingPuts(real, "checkpoints/")  # the metadata cannot be written
        try:
            with pytest.raises(StoreError):
                job.checkpoint()
        finally:
            job.catalog.store = real
        entries = read_history(job.store).entries
    failed = [e for e in entries if e["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["checkpoint_id"] == 2
    assert "StoreError: refused put of checkpoints/" in failed[0]["reason"]


def test_segments_roll_and_the_oldest_are_dropped(tmp_path: Path) -> None:
    store = open_store((tmp_path / "root").as_uri())
    history = CheckpointHistory(store, segment_entries=4, max_segments=3, flush_entries=5, flush_interval_s=3600)
    for i in range(1, 20):
        assert history.record_checkpoint(i, {"sync_ms": 1.0})
    history.close()  # the last 4 entries waited for the flush
    keys = [o.key for o in store.list(HISTORY_PREFIX)]
    # segments 0 and 1 dropped, one copy of each other: 2 and 3 full, 4 with 3 entries
    assert keys == [history_segment_key(2, 4), history_segment_key(3, 4), history_segment_key(4, 3)]
    read = read_history(store)
    assert [e["checkpoint_id"] for e in read.entries] == list(range(9, 20))
    # a new writer (a restarted job) continues the newest segment
    again = CheckpointHistory(store, segment_entries=4, max_segments=3)
    again.record_restart(2, "WorkerLostError: worker 0 died")
    read = read_history(store)
    assert read.entries[-1] == {**read.entries[-1], "status": "restart", "attempt": 2}
    assert [o.key for o in store.list(HISTORY_PREFIX)][-1] == history_segment_key(4, 4)


def test_every_read_is_verified(tmp_path: Path) -> None:
    store = open_store((tmp_path / "root").as_uri())
    history = CheckpointHistory(store, flush_interval_s=0)
    for i in (1, 2, 3):
        history.record_checkpoint(i, {"sync_ms": 1.0})
    key = history_segment_key(0, 3)
    lines = store.get(key).splitlines(keepends=True)
    store.delete(key)
    store.put(key, lines[0] + lines[1].replace(b'"checkpoint_id":2', b'"checkpoint_id":9') + lines[2])
    read = read_history(store)
    assert [e["checkpoint_id"] for e in read.entries] == [1, 3]
    assert len(read.errors) == 1 and "line 2" in read.errors[0] and "checksum mismatch" in read.errors[0]


def _history_requests(store: FaultInjectingStore) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def count(op: str, key: str) -> None:
        if key.startswith(HISTORY_PREFIX):
            calls.append((op, key))

    store.before("*", count)
    return calls


def test_the_history_costs_a_fraction_of_a_store_request_per_checkpoint(tmp_path: Path) -> None:
    """Entries are written together: 32 checkpoints cost two flushes of two requests each (the
    first also lists the segments), where a write per entry cost three requests per checkpoint."""
    url = (tmp_path / "root").as_uri()
    store = FaultInjectingStore(open_store(url))
    calls = _history_requests(store)
    job = statelog.StateJob(url, store=store)
    try:
        job.checkpoint_history.flush_interval_s = 3600  # this test counts the flushes by entries only
        for i in range(32):
            _count(job, range(i, i + 3))
            job.checkpoint()
        assert [op for op, _ in calls] == ["list", "put", "put", "delete"], calls  # 4 / 32 = 0.125 per checkpoint
    finally:
        job.close()
    assert len(calls) == 4  # nothing was waiting at close
    assert [e["checkpoint_id"] for e in read_history(open_store(url)).entries] == list(range(1, 33))


def test_waiting_entries_are_written_by_the_timer_and_at_close(tmp_path: Path) -> None:
    store = open_store((tmp_path / "root").as_uri())
    history = CheckpointHistory(store, flush_interval_s=0.2)
    history.record_checkpoint(1, {"sync_ms": 1.0})
    # no further append and no close: the timer writes it within the interval
    wait_until(lambda: len(read_history(store).entries) == 1, 30, "the timer's flush")
    history = CheckpointHistory(store, flush_interval_s=3600)
    history.record_checkpoint(2, {"sync_ms": 1.0})
    assert [e["checkpoint_id"] for e in read_history(store).entries] == [1]  # waiting
    history.record_failure(3, "StoreError: refused")  # a failure is written at once, with what waits
    assert [e["checkpoint_id"] for e in read_history(store).entries] == [1, 2, 3]
    history.record_checkpoint(4, {"sync_ms": 1.0})
    history.close()
    assert [e["checkpoint_id"] for e in read_history(store).entries] == [1, 2, 3, 4]
    assert [o.key for o in store.list(HISTORY_PREFIX)] == [history_segment_key(0, 4)]  # no shorter copy left


def test_a_consumer_loop_records_its_figures(tmp_path: Path) -> None:
    """What a consumer loop reports through ``job.metrics`` goes into its checkpoints' entries."""
    url = (tmp_path / "root").as_uri()
    with statelog.open(url) as job:
        _count(job, range(3))
        job.checkpoint()  # nothing reported yet: no loop fields
        job.metrics.records_in(100)
        job.metrics.records_out(40)
        job.metrics.watermark(1_700_000_000_000)
        job.metrics.kafka_lag("clicks", 0, 7)
        job.metrics.kafka_lag("clicks", 1, 3)
        job.checkpoint()
        job.metrics.records_in(50)
        job.metrics.kafka_lag("clicks", 0, 0)
        job.checkpoint()
    read = read_history(open_store(url))
    assert read.errors == []
    first, second, third = read.entries
    assert not {"source_records", "records_out", "watermark_ms", "kafka_lag", "records_per_s"} & first.keys()
    assert {k: second[k] for k in ("source_records", "records_out", "watermark_ms", "kafka_lag")} == {
        "source_records": 100, "records_out": 40, "watermark_ms": 1_700_000_000_000, "kafka_lag": 10}
    assert "records_per_s" not in second  # the first entry with records: no interval yet
    assert third["source_records"] == 150 and third["kafka_lag"] == 3 and third["records_per_s"] > 0
