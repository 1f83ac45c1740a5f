"""Changelog writer and reader: sealing, durability, filtering, faults and corruption."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

import statelog
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.changelog.reader import SegmentReader
from statelog.errors import (
    CheckpointAbortedError,
    CorruptionError,
    TransientStoreError,
    WriterFailedError,
)
from statelog.store import open_store
from statelog.store.faulty import FaultInjectingStore

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def _stop_flusher(writer):
    """Drive flushes by hand (deterministic tests of what a flush takes)."""
    writer._closed = True
    writer._wake.set()
    writer._flusher.join()
    writer._closed = False


def test_records_after_the_seal_are_invisible_even_in_the_same_segment(tmp_path):
    root = tmp_path.as_uri()
    job = statelog.open(root)
    b = job.backend("op")
    _stop_flusher(job.writer)
    count = b.get_state(COUNT)
    for k in range(10):
        b.set_current_key(k)
        count.update(1)
    cid = job.next_checkpoint_id()
    snap = b.snapshot(cid)  # synchronous part: seals position 10
    for k in range(10):  # processing continues before the upload
        b.set_current_key(k)
        count.update(99)
    job.writer._flush_once()  # one segment holds records 0..19
    handle = snap.result(10)
    (rng,) = handle.changelog
    assert (rng.start, rng.end) == (0, 10)
    assert len(rng.segments) == 1 and rng.segments[0].end == 20
    job.publish_checkpoint(cid, [handle], {"offset": 10})
    job.close(flush=False)

    job = statelog.open(root)
    restored = job.backend("op", restore=cid)
    values = {k: v for k, _, v in restored.get_state(COUNT).entries()}
    assert values == dict.fromkeys(range(10), 1)
    job.close()


def test_cancelled_snapshot_is_aborted(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    _stop_flusher(job.writer)
    b.set_current_key("k")
    b.get_state(COUNT).update(5)
    snap = b.snapshot(1)
    snap.cancel()
    with pytest.raises(CheckpointAbortedError, match="cancelled"):
        snap.result(1)
    job.close(flush=False)


def test_one_segment_per_flush_for_all_streams(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    backends = [job.backend("op", subtask=i, parallelism=4) for i in range(4)]
    _stop_flusher(job.writer)
    for i, b in enumerate(backends):
        st = b.get_state(COUNT)
        for k in range(2000):
            try:
                b.set_current_key(k)
            except statelog.errors.KeyGroupError:
                continue
            st.update(i)
    job.writer._flush_once()
    time.sleep(0.2)
    segs = list(job.store.list("changelog/"))
    assert len(segs) == 1
    footer = SegmentReader(job.store).verify_segment(segs[0].key)
    assert {s.stream for s in footer.streams} == {b._streams["count"].stream_id for b in backends}
    job.close()


def test_coalescing_keeps_only_the_last_write_per_key(tmp_path):
    job = statelog.open(tmp_path.as_uri(), writer_options={"coalesce": True})
    b = job.backend("op")
    _stop_flusher(job.writer)
    count = b.get_state(COUNT)
    lst = b.get_state(ListStateDescriptor("l", pa.int64()))
    mp = b.get_state(MapStateDescriptor("m", pa.int64(), key_type=pa.string()))
    b.set_current_key("k")
    for i in range(100):
        count.update(i)
        lst.add(i)
        mp.put("a", i)
        mp.put(f"x{i % 3}", i)
    lst.update([7, 8])
    lst.add(9)
    job.writer._flush_once()
    snap = b.snapshot(1)
    handle = snap.result(10)
    rows = sum(
        batch.table.num_rows
        for r in handle.changelog
        for batch in SegmentReader(job.store).read_range(r.stream, r.start, r.end, r.key_groups, r.segments)
    )
    assert rows == 1 + 2 + 1 + 3  # count, list replace+append, map a, map x0..x2
    job.publish_checkpoint(1, [handle], {})
    job.close(flush=False)
    job = statelog.open(tmp_path.as_uri())
    r = job.backend("op", restore=1)
    r.set_current_key("k")
    assert r.get_state(COUNT).value() == 99
    assert r.get_state(ListStateDescriptor("l", pa.int64())).get() == [7, 8, 9]
    m = r.get_state(MapStateDescriptor("m", pa.int64(), key_type=pa.string()))
    assert dict(m.items()) == {"a": 99, "x0": 99, "x1": 97, "x2": 98}
    job.close()


def test_back_pressure_blocks_the_writer_task_without_loss(tmp_path):
    inner = open_store(tmp_path.as_uri())
    slow = FaultInjectingStore(inner)
    slow.add_latency("put", 0.05)
    job = statelog.StateJob(
        tmp_path.as_uri(), store=slow,
        writer_options={"max_inflight_bytes": 1, "max_buffered_records": 1000, "persist_delay": 0.001},
    )
    b = job.backend("op")
    count = b.get_state(COUNT)
    t0 = time.monotonic()
    peak = 0
    for k in range(20_000):
        b.set_current_key(k % 500)
        count.update(k)
        peak = max(peak, b._streams["count"].buffered)
    # the buffer is bounded: the task checks the limit when it switches keys (a key's
    # mutations between two switches may overshoot by a few records)
    assert peak <= 1_000 + 10
    assert time.monotonic() - t0 > 0.1  # the task waited for uploads
    meta = job.checkpoint(sources={})
    job.close()
    job = statelog.open(tmp_path.as_uri())
    values = dict((k, v) for k, _, v in job.backend("op", restore=meta).get_state(COUNT).entries())
    assert values == {k: 19_500 + k for k in range(500)}
    job.close()


def test_upload_failure_fails_the_checkpoint_and_the_task(tmp_path):
    inner = open_store(tmp_path.as_uri())
    flaky = FaultInjectingStore(inner)
    job = statelog.StateJob(tmp_path.as_uri(), store=flaky)
    b = job.backend("op")
    count = b.get_state(COUNT)
    b.set_current_key(1)
    count.update(1)
    job.checkpoint(sources={"o": 1})
    flaky.fail_next("put", count=100, error=TransientStoreError("injected: store down"))
    count.update(2)
    with pytest.raises(WriterFailedError, match="restart the task"):
        job.checkpoint(sources={"o": 2})
    with pytest.raises(WriterFailedError):
        for k in range(100):
            b.set_current_key(k % 3)
            count.update(k)
            time.sleep(0.001)
    assert job.catalog.checkpoint_ids() == [1]  # nothing partial was published
    job.close(flush=False)


def test_transient_upload_errors_are_retried(tmp_path):
    inner = open_store(tmp_path.as_uri())
    flaky = FaultInjectingStore(inner)
    flaky.fail_next("put", count=2, error=TransientStoreError("injected blip"), key_prefix="changelog/")
    job = statelog.StateJob(tmp_path.as_uri(), store=flaky)
    b = job.backend("op")
    b.set_current_key(1)
    b.get_state(COUNT).update(3)
    meta = job.checkpoint(sources={})
    assert meta.changelog_bytes > 0 and sum(flaky.injected.values()) >= 2
    job.close()


def test_flipped_byte_in_a_segment_fails_restore_naming_the_object(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    count = b.get_state(COUNT)
    for k in range(100):
        b.set_current_key(k)
        count.update(k)
    meta = job.checkpoint(sources={})
    job.close()
    (seg,) = {s.name for s in meta.operators["op"].subtasks[0].changelog[0].segments}
    path = tmp_path / seg
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x40
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    job = statelog.open(tmp_path.as_uri())
    with pytest.raises(CorruptionError) as e:
        job.backend("op", restore=meta.checkpoint_id)
    assert seg in str(e.value)
    job.close()


def test_missing_segment_fails_restore_naming_the_object(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    b.set_current_key("x")
    b.get_state(COUNT).update(1)
    meta = job.checkpoint(sources={})
    job.close()
    (seg,) = meta.segment_names()
    (tmp_path / seg).unlink()
    job = statelog.open(tmp_path.as_uri())
    with pytest.raises(CorruptionError, match="missing") as e:
        job.backend("op", restore=meta.checkpoint_id)
    assert seg in str(e.value)
    job.close()


def test_concurrent_writers_in_threads_keep_their_streams_apart(tmp_path):
    job = statelog.open(tmp_path.as_uri(), writer_options={"persist_delay": 0.001})
    backends = [job.backend("op", subtask=i, parallelism=2) for i in range(2)]

    def work(b):
        st = b.get_state(COUNT)
        for k in range(20_000):
            try:
                b.set_current_key(k)
            except statelog.errors.KeyGroupError:
                continue
            st.update(k)

    threads = [threading.Thread(target=work, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    meta = job.checkpoint(sources={})
    job.close()
    job = statelog.open(tmp_path.as_uri())
    r = job.backend("op", restore=meta)  # parallelism 1 reads both subtasks' ranges
    assert {k: v for k, _, v in r.get_state(COUNT).entries()} == {k: k for k in range(20_000)}
    job.close()


def test_coalescing_never_crosses_a_sealed_checkpoint_position(tmp_path):
    job = statelog.open(tmp_path.as_uri(), writer_options={"coalesce": True})
    b = job.backend("op")
    _stop_flusher(job.writer)
    count = b.get_state(COUNT)
    b.set_current_key("k")
    count.update(1)
    snap = b.snapshot(1)  # sealed at position 1
    count.update(99)  # overwrites the same key after the seal, in the same flush
    job.writer._flush_once()
    job.publish_checkpoint(1, [snap.result(10)], {})
    job.close(flush=False)
    r = statelog.open(tmp_path.as_uri()).backend("op", restore=1)
    r.set_current_key("k")
    assert r.get_state(COUNT).value() == 1


def test_a_range_whose_segments_leave_a_gap_fails_instead_of_skipping_records(tmp_path):
    """Metadata that drops a segment from a range must not restore fewer records silently."""
    import dataclasses

    job = statelog.open(tmp_path.as_uri(), writer_options={"persist_delay": 0.001})
    b = job.backend("op")
    count = b.get_state(COUNT)
    for k in range(3):  # three flushes: three segments for the stream
        b.set_current_key(k)
        count.update(k)
        job.writer.flush()
    meta = job.checkpoint(sources={})
    job.close()
    h = meta.operators["op"].subtasks[0]
    (rng,) = [r for r in h.changelog if r.stream.endswith("/count")]
    assert len(rng.segments) == 3
    holed = dataclasses.replace(rng, segments=(rng.segments[0], rng.segments[2]))
    reader = SegmentReader(open_store(tmp_path.as_uri()))
    with pytest.raises(CorruptionError, match="not covered by its segments"):
        list(reader.read_range(holed.stream, holed.start, holed.end, holed.key_groups, holed.segments))
    wrong = dataclasses.replace(rng.segments[1], start=0, end=3)  # claims a span the footer lacks
    with pytest.raises(CorruptionError, match="does not hold records") as e:
        list(reader.read_range(rng.stream, rng.start, rng.end, rng.key_groups, (wrong,)))
    assert wrong.name in str(e.value)
