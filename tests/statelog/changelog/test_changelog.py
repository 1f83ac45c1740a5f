"""Changelog writer and reader: sealing, durability, filtering, faults and corruption."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

import statelog
import statelog.changelog.stream as stream_mod
from statelog import (
    PICKLE,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statelog.changelog import encoder, records
from statelog.changelog import format as fmt
from statelog.changelog.reader import SegmentReader
from statelog.errors import (
    CheckpointAbortedError,
    CorruptionError,
    TransientStoreError,
    WriterFailedError,
)
from statelog.store import open_store
from statelog.testing import FaultInjectingStore

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def _stop_flusher(writer):
    """Drive flushes by hand (deterministic tests of what a flush takes)."""
    writer.scheduler.stop()


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
    job.writer.scheduler.flush_once()  # one segment holds records 0..19
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
    job.writer.scheduler.flush_once()
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
    job.writer.scheduler.flush_once()
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
    _restore_fails(tmp_path, meta.checkpoint_id, seg, None)


def _restore_fails(tmp_path, cid: int, seg: str, match: str | None) -> None:
    """An eager restore fails when the backend opens, an on-demand one (the default) when its
    key groups load (here: wait_loaded); both name the object."""
    with statelog.open(tmp_path.as_uri()) as job:
        with pytest.raises(CorruptionError, match=match) as e:
            job.backend("op", restore=cid, on_demand=False)
        assert seg in str(e.value)
    with statelog.open(tmp_path.as_uri()) as job:
        b = job.backend("op", restore=cid, changelog=False)
        b.get_state(COUNT)
        with pytest.raises(CorruptionError, match=match) as e:
            b.wait_loaded()
        assert seg in str(e.value)


def test_missing_segment_fails_restore_naming_the_object(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    b = job.backend("op")
    b.set_current_key("x")
    b.get_state(COUNT).update(1)
    meta = job.checkpoint(sources={})
    job.close()
    (seg,) = meta.segment_names()
    (tmp_path / seg).unlink()
    _restore_fails(tmp_path, meta.checkpoint_id, seg, "missing")


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
    job.writer.scheduler.flush_once()
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


# -- columnar record buffers (statelog/_ext/fastpath.c RecordBuffer) ---------------------------

needs_ext = pytest.mark.skipif(stream_mod._fastpath is None, reason="the C extension is not built")

MIXED = [
    COUNT,
    ValueStateDescriptor("small", pa.int8()),  # int64 storage, cast to int8
    ValueStateDescriptor("big", pa.uint64()),  # values past int64 go through the overflow list
    ValueStateDescriptor("real", pa.float64()),  # ints go through the overflow list
    ValueStateDescriptor("f32", pa.float32()),  # Python objects
    ValueStateDescriptor("text", pa.string()),  # Python objects
    ValueStateDescriptor("obj", PICKLE),  # Python objects
    ReducingStateDescriptor("sum", pa.int64(), reduce_fn=lambda a, b: a + b),
    ListStateDescriptor("l", pa.int64()),  # full layout: a flat list either way
]


def _mixed_workload(b, lo, hi):
    states = [b.get_state(d) for d in MIXED]
    count, small, big, real, f32, text, obj, total, lst = states
    for i in range(lo, hi):
        b.set_current_key(i % 37 if i % 5 else ("k", i % 7))
        for st in states:
            st.set_namespace(None if i % 3 else ("w", i % 4))
        count.update(count.value() + 1)
        small.update(i % 100 - 50)
        big.update(2**64 - 1 - i if i % 2 else i)
        real.update(i if i % 4 == 0 else (float("nan") if i % 4 == 1 else i / 3))
        f32.update(i / 7)
        text.update(f"t{i}")
        obj.update({"i": i})
        total.add(i)
        lst.add(i)
        if i % 11 == 0:
            count.update(None)
            big.clear()
            real.update(None)
            text.clear()
        b.timers.register_event_time_timer(i)
        if i % 13 == 0:
            b.timers.delete_event_time_timer(i - 1)
    return states


def _segment_blocks(job):
    """Every block of every segment: its index entry (without byte counts, which depend on
    how Arrow pads the buffers it is given) and its decoded content."""
    reader = SegmentReader(job.store)
    out = []
    for obj in sorted(job.store.list("changelog/"), key=lambda o: o.key):
        footer = reader.verify_segment(obj.key)
        data = job.store.get(obj.key)
        for i in footer.blocks:
            info = (i.state, i.rows, i.first_seq, i.last_seq, i.kg_min, i.kg_max)
            table = fmt.decode_block(data[i.offset : i.offset + i.length], i, obj.key)
            out.append((info, table.schema, repr(table.to_pydict())))  # repr: NaN != NaN
    return out


@needs_ext
@pytest.mark.parametrize("coalesce", [False, True])
@pytest.mark.parametrize("batch", [4096, 7])
def test_columnar_buffers_write_the_same_segments_as_flat_lists(tmp_path, coalesce, batch):
    """Same records, same blocks: the columnar buffer only changes how the records wait in
    memory. ``batch`` 7 makes the task convert many small batches."""

    def run(columnar):
        root = (tmp_path / str(columnar)).as_uri()
        job = statelog.open(root, writer_options={"coalesce": coalesce, "encode_batch_records": batch,
                                                  "columnar": columnar})
        b = job.backend("op")
        _stop_flusher(job.writer)
        _mixed_workload(b, 0, 150)
        snap1 = b.snapshot(1)  # a seal between the two halves: coalescing keeps both sides
        states = _mixed_workload(b, 150, 300)
        assert [b._streams[d.name].columnar for d in MIXED] == [columnar] * 8 + [False]
        job.writer.scheduler.flush_once()
        snap1.result(10)
        states = _mixed_workload(b, 300, 320)
        snap2 = b.snapshot(2)
        job.writer.scheduler.flush_once()
        job.publish_checkpoint(2, [snap2.result(10)], {})
        live = [len(list(st.entries())) for st in states]
        blocks = _segment_blocks(job)
        job.close(flush=False)
        r = statelog.open(root).backend("op", restore=2)
        restored = [sorted(r.get_state(d).entries(), key=repr) for d in MIXED]
        assert [len(e) for e in restored] == live
        return blocks, repr(restored)  # repr: NaN != NaN

    (columnar, columnar_state), (flat, flat_state) = run(True), run(False)
    assert [b[0] for b in columnar] == [b[0] for b in flat]
    assert columnar == flat
    assert columnar_state == flat_state


@needs_ext
def test_record_buffer_columns_match_pyarrow_conversion():
    """RecordBuffer.take() + narrow_columns give the arrays pa.array gives for the lists."""
    cases = [
        (pa.int64(), [1, None, -(2**63), 2**63 - 1, 0]),
        (pa.uint64(), [2**64 - 1, None, 3, 2**63]),
        (pa.int16(), [-5, None, 300]),
        (pa.float64(), [1.5, None, 2, float("inf"), -0.0]),
        (pa.string(), ["a", None, ""]),
        (PICKLE, [{"a": 1}, None]),
    ]
    for value_type, values in cases:
        rb = stream_mod._fastpath.RecordBuffer(records.buffer_value_kind(value_type))
        recs = [(b"k%d" % i * (i + 1), (i * 7919) % 65536, b"\x00" if i % 2 else b"ns", i % 3 + 1, v)
                for i, v in enumerate(values)]
        for rec in recs:
            rb.extend(rec)
        assert len(rb) == len(recs) * records.NARROW_WIDTH and rb.records == len(recs)
        cols, kg_min, kg_max = records.narrow_columns(rb.take(), value_type)
        assert len(rb) == 0
        want = [list(c) for c in zip(*recs, strict=True)]
        assert cols[records.C_KEY].equals(pa.array(want[0], pa.binary()))
        assert cols[records.C_KG].equals(pa.array(want[1], pa.uint16()))
        assert cols[records.C_NS].equals(pa.array(want[2], pa.binary()))
        assert cols[records.C_OP].equals(pa.array(want[3], pa.uint8()))
        assert (kg_min, kg_max) == (min(want[1]), max(want[1]))
        value = cols[records.N_VALUE]
        if isinstance(value, list):
            assert value == want[4]
        else:
            assert value.equals(pa.array(want[4], value_type))
    empty = stream_mod._fastpath.RecordBuffer(1).take()
    assert empty[0] == 0 and empty[11] > empty[12]


@needs_ext
def test_record_buffer_rejects_bad_records_without_appending_part_of_them():
    rb = stream_mod._fastpath.RecordBuffer(1)
    rb.extend((b"k", 1, b"\x00", 1, 5))
    for bad in [
        (b"k", 1, b"\x00", 1),  # too short
        ("k", 1, b"\x00", 1, 5),  # key not bytes
        (b"k", 1, None, 1, 5),  # namespace not bytes
        (b"k", -1, b"\x00", 1, 5),  # key group out of range
        (b"k", 65536, b"\x00", 1, 5),
        (b"k", 1, b"\x00", 256, 5),  # op out of range
        [b"k", 1, b"\x00", 1, 5],  # not a tuple
    ]:
        with pytest.raises((TypeError, ValueError, OverflowError)):
            rb.extend(bad)
        assert rb.records == 1
    rb.extend((b"k2", 2, b"\x00", 1, 2**70))  # fits no int64: kept as an object
    raw = rb.take()
    assert raw[0] == 2 and raw[10] == [(1, 2**70)]


@needs_ext
def test_record_buffer_take_is_all_or_nothing_under_concurrent_appends(tmp_path):
    """The flusher takes whole records while a task thread appends through the C update."""
    job = statelog.open(tmp_path.as_uri(), writer_options={"persist_delay": 0.0005, "columnar": True})
    b = job.backend("op")
    count = b.get_state(COUNT)
    assert b._streams["count"].columnar
    for i in range(60_000):
        b.set_current_key(i % 1000)
        count.update(i)
    meta = job.checkpoint(sources={})
    job.close()
    r = statelog.open(tmp_path.as_uri()).backend("op", restore=meta)
    got = {k: v for k, _, v in r.get_state(COUNT).entries()}
    assert got == {k: 59_000 + k for k in range(1000)}


def test_batch_nbytes_is_arrow_nbytes():
    """The footer's raw_length is documented as the sum of RecordBatch.nbytes."""
    n = 300
    cols = [
        pa.array([1, None, 3] * 100, pa.int64()),
        pa.array([b"ab", b"", None] * 100, pa.binary()),
        pa.nulls(n, pa.int64()),
        pa.nulls(n, pa.null()),
        pa.array(["x", "yz", None] * 100, pa.large_string()),
        pa.array([1.5, None, 2.0] * 100, pa.float32()),
        pa.array([True, False, None] * 100),
        pa.array([[1], None, [2, 3]] * 100),
        pa.array([1, 2, 3] * 100, pa.uint16()),
        pa.array(["é", "yz", None] * 100, pa.string()),
        pa.array([1, 2, 3] * 100, pa.int8()),
        pa.array([{"a": 1}, None, {"a": 2}] * 100),
        pa.repeat(pa.scalar(b"\x00", pa.binary()), 4096).slice(0, n),
    ]
    batch = pa.RecordBatch.from_arrays(cols, names=[str(i) for i in range(len(cols))])
    for off, length in [(0, n), (3, 50), (7, 1), (13, 200), (0, 0), (n - 1, 1), (1, n - 1)]:
        part = batch.slice(off, length)
        assert encoder.batch_nbytes(part) == part.nbytes


def test_every_block_codec_restores_the_same_state(tmp_path):
    sizes = {}
    for codec in ("zstd", "lz4", "none"):
        root = (tmp_path / codec).as_uri()
        job = statelog.open(root, writer_options={"compression": codec})
        b = job.backend("op")
        st = b.get_state(COUNT)
        for i in range(20_000):
            b.set_current_key(i % 700)
            st.update(i)
        meta = job.checkpoint()
        sizes[codec] = sum(o.size for o in job.store.list("changelog/"))
        job.close()
        r = statelog.open(root).backend("op", restore=meta)
        got = {k: v for k, _, v in r.get_state(COUNT).entries()}
        assert got == {k: max(range(k, 20_000, 700)) for k in range(700)}
    # the codecs really differ: zstd packs tighter than LZ4, which packs tighter than nothing
    assert sizes["zstd"] < sizes["lz4"] < sizes["none"], sizes


def test_unknown_block_codec_is_a_config_error(tmp_path):
    with pytest.raises(statelog.errors.ConfigError, match="compression must be one of zstd, lz4, none"):
        _ = statelog.open(tmp_path.as_uri(), writer_options={"compression": "gzip"}).writer


def test_flush_soon_uploads_partial_batches_without_a_checkpoint(tmp_path):
    """A coming checkpoint starts the upload of every buffered record, including the partial
    batch a busy task would otherwise keep, without any persist() waiting for it."""
    job = statelog.open(tmp_path.as_uri(), writer_options={"persist_delay": 3600, "encode_batch_records": 64})
    b = job.backend("op")
    st = b.get_state(COUNT)
    for i in range(100):  # one batch of 64 taken by the task, 36 still in its buffer
        b.set_current_key(i)
        st.update(i)
    stream = b._streams["count"]
    time.sleep(0.3)
    assert stream.durable == 0 and stream.encoded_records == 64
    job.flush_soon()
    deadline = time.monotonic() + 10
    while stream.durable < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.durable == 100 and not stream._waiters
    job.close()


def test_flush_soon_without_a_writer_does_nothing(tmp_path):
    job = statelog.open(tmp_path.as_uri())
    job.flush_soon()
    assert job._writer is None
    job.close()
