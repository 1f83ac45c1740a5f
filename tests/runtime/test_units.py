"""In-process unit tests of the runtime's parts (no worker processes)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from materializer.options import MaterializerOptions
from runtime import (
    CollectSink,
    ExponentialBackoff,
    FailureRate,
    FileSink,
    FileSource,
    FixedDelay,
    GeneratorSource,
    JobGraphError,
    KeyedProcessFunction,
    SlidingEventTimeWindows,
    StreamExecutionEnvironment,
    TimeWindow,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from runtime.api.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.cluster.master import serialize_graph
from runtime.connectors.sinks import PENDING_DIR, FileSinkOperator, read_committed
from runtime.connectors.sources import SourceSplits
from runtime.graph import FORWARD, HASH, JobGraph
from runtime.network.barriers import BarrierAligner, BarrierTracker
from runtime.network.input_channel import InputChannel
from runtime.network.router import EdgeOutput
from statelog import key_group_of, layout, subtask_for_key_group
from statelog.errors import ConfigError
from tests.support import jobs


def env(tmp_path: Path, **kw: Any) -> StreamExecutionEnvironment:
    return StreamExecutionEnvironment(state_root=(tmp_path / "root").as_uri(), **kw)


# -- restart strategies --------------------------------------------------------------------------


def test_fixed_delay_allows_a_number_of_restarts() -> None:
    s = FixedDelay(attempts=2, delay_s=0.5)
    assert [s.next_delay(), s.next_delay(), s.next_delay()] == [0.5, 0.5, None]


def test_exponential_backoff_grows_caps_and_resets() -> None:
    s = ExponentialBackoff(initial_s=1, max_s=5, multiplier=2, reset_after_s=100)
    assert [s.next_delay(t) for t in (0, 1, 2, 3)] == [1, 2, 4, 5]
    assert s.next_delay(200) == 1  # stable for reset_after_s: back to the initial delay
    assert ExponentialBackoff(max_attempts=1).next_delay(0) is not None
    limited = ExponentialBackoff(max_attempts=1)
    limited.next_delay(0)
    assert limited.next_delay(1) is None


def test_failure_rate_gives_up_on_too_many_failures_in_the_interval() -> None:
    s = FailureRate(max_failures=2, interval_s=10, delay_s=0.1)
    assert [s.next_delay(t) for t in (0, 1)] == [0.1, 0.1]
    assert s.next_delay(2) is None
    s = FailureRate(max_failures=2, interval_s=10, delay_s=0.1)
    assert [s.next_delay(t) for t in (0, 20, 40, 41)] == [0.1, 0.1, 0.1, 0.1]


# -- windows -------------------------------------------------------------------------------------


def test_tumbling_and_sliding_assigners() -> None:
    assert TumblingEventTimeWindows(100).assign(250) == [TimeWindow(200, 300)]
    assert TumblingEventTimeWindows(100).assign(-1) == [TimeWindow(-100, 0)]
    assert TumblingEventTimeWindows(100, offset_ms=30).assign(20) == [TimeWindow(-70, 30)]
    ws = SlidingEventTimeWindows(100, 25).assign(260)
    assert sorted(ws) == [TimeWindow(175, 275), TimeWindow(200, 300), TimeWindow(225, 325), TimeWindow(250, 350)]
    assert all(w.start <= 260 < w.end for w in ws)
    with pytest.raises(JobGraphError):
        TumblingEventTimeWindows(0)


# -- barriers ------------------------------------------------------------------------------------


def test_aligner_blocks_channels_until_every_barrier_arrived() -> None:
    a = BarrierAligner(3)
    assert a.on_barrier(0, 1) is None and a.blocked == {0}
    assert a.on_barrier(2, 1) is None and a.blocked == {0, 2}
    assert a.on_barrier(1, 1) is not None and a.blocked == set()
    assert a.on_barrier(0, 1) is None  # a stale barrier of a finished checkpoint


def test_tracker_never_blocks_and_completes_on_the_last_barrier() -> None:
    t = BarrierTracker(2)
    assert t.on_barrier(0, 1) is None and t.blocked == set()
    assert t.on_barrier(0, 2) is None
    assert t.on_barrier(1, 1) is not None
    assert t.on_barrier(1, 2) is not None


# -- graph ---------------------------------------------------------------------------------------


class _Noop(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> None:
        return None


def test_chaining_and_edges(tmp_path: Path) -> None:
    e = env(tmp_path, parallelism=2)
    src = e.from_source(GeneratorSource(jobs.make_click, 10), uid="src")
    other = e.from_source(GeneratorSource(jobs.make_click, 10), uid="other")
    mapped = src.map(jobs.twice).filter(bool)  # chained into the source's task
    keyed = mapped.union(other).key_by(jobs.click_user).process(_Noop(), uid="p")
    keyed.sink_to(CollectSink(), uid="sink1")  # fan-out: neither sink is chained
    keyed.map(str).sink_to(CollectSink(), uid="sink2")
    g = JobGraph.build(e.graph)
    names = [v.name for v in g.vertices]
    assert names[0] == "source:src -> map -> filter"
    proc = next(v for v in g.vertices if v.name == "process:p")
    assert sorted((x.partition, x.input_index) for x in proc.inputs) == [(HASH, 0), (HASH, 0)]
    assert [len(g.input_channels(proc, 0, 2))] == [4]
    sink_vertices = [v for v in g.vertices if "sink" in v.name]
    assert {v.name for v in sink_vertices} == {"sink:sink1", "map -> sink:sink2"}
    assert all(x.partition == FORWARD for v in sink_vertices for x in v.inputs)
    serialize_graph(g)  # picklable for the workers


def test_graph_validation(tmp_path: Path) -> None:
    e = env(tmp_path)
    s = e.from_source(GeneratorSource(jobs.make_click, 10), uid="src")
    with pytest.raises(JobGraphError, match="no sink"):
        JobGraph.build(e.graph)
    s.key_by(jobs.click_user).process(_Noop(), uid="src").sink_to(CollectSink(), uid="out")
    with pytest.raises(JobGraphError, match="unique"):
        JobGraph.build(e.graph)
    with pytest.raises(JobGraphError, match="KeyedProcessFunction"):
        s.key_by(jobs.click_user).process(jobs.twice, uid="x")  # type: ignore[arg-type]
    with pytest.raises(JobGraphError, match="key both streams"):
        s.connect(s.key_by(jobs.click_user))


def test_environment_validation(tmp_path: Path) -> None:
    env(tmp_path, mode="exactly_once_unaligned")
    with pytest.raises(JobGraphError, match="unknown checkpointing mode"):
        env(tmp_path, mode="sometimes")
    with pytest.raises(ConfigError):
        env(tmp_path, parallelism=0)
    with pytest.raises(JobGraphError, match="state_root"):
        StreamExecutionEnvironment()
    assert env(tmp_path, materializer=True).config.materializer == MaterializerOptions()
    assert env(tmp_path, materializer={"interval_s": 2}).config.materializer == MaterializerOptions(interval_s=2)
    assert env(tmp_path, materializer=False).config.materializer is None
    with pytest.raises(ConfigError, match=r"unknown materializer option\(s\) \['every'\]; valid: \['interval_s'"):
        env(tmp_path, materializer={"every": 2})
    with pytest.raises(JobGraphError, match="materializer must be"):
        env(tmp_path, materializer="yes")


# -- sources -------------------------------------------------------------------------------------


def test_file_source_positions_resume_appended_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"n": 1}\n{"n": 2}\n{"n": 3')
    src = FileSource(tmp_path, bounded=False)
    r = src.reader("a.jsonl", None)
    assert r.read(10) == [{"n": 1}, {"n": 2}]  # the incomplete last line waits
    pos = r.position()
    assert pos == {"offset": 2, "byte": 18} and not r.finished
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write('}\n{"n": 4}\n')
    r2 = src.reader("a.jsonl", pos)
    assert r2.read(10) == [{"n": 3}, {"n": 4}]
    bounded = FileSource(tmp_path).reader("a.jsonl", {"offset": 3, "byte": 27})
    assert bounded.read(10) == [{"n": 4}] and bounded.finished
    with pytest.raises(JobGraphError, match="append-only"):
        src.reader("a.jsonl", {"offset": 9, "byte": 999})


def test_source_splits_watermark_is_the_minimum_over_unfinished_splits() -> None:
    src = GeneratorSource(jobs.make_order, 16, splits=2)
    splits = SourceSplits(src, {"0000": None, "0001": {"next": 8}}, WatermarkStrategy(jobs.order_ts, 10))
    assert splits.watermark() == MIN_WATERMARK
    splits.read(4)  # split 0: orders 0..3
    assert splits.watermark() == MIN_WATERMARK  # split 1 has not produced yet
    splits.read(4)  # split 1: orders 8..11
    assert splits.watermark() == jobs.EPOCH + 3 * 3 - 11
    while not splits.finished:
        splits.read(100)
    assert splits.watermark() == MAX_WATERMARK
    assert splits.positions()["0001"]["next"] == 16


# -- routing and channels ------------------------------------------------------------------------


class _Collect:
    def __init__(self) -> None:
        self.frames: list[Any] = []

    def send(self, frame: Any) -> None:
        self.frames.append(frame)

    def backlog(self) -> int:
        return len(self.frames)

    def close(self) -> None:
        pass


def test_hash_routing_follows_key_groups_and_events_follow_records() -> None:
    outs = [_Collect() for _ in range(3)]
    edge = EdgeOutput(HASH, jobs.click_user, outs, 128, batch_size=1000)
    events = [jobs.make_click(0, i) for i in range(200)]
    for e in events:
        edge.emit(e, e[1])
    edge.event(("barrier", 7))
    for i, out in enumerate(outs):
        (records, event), = out.frames
        assert event == ("barrier", 7)
        assert all(subtask_for_key_group(128, 3, key_group_of(v[0], 128)) == i for v, _ts in records)
    assert sum(len(o.frames[0][0]) for o in outs) == 200


def test_input_channel_back_pressure() -> None:
    import threading

    def frame(n: int) -> bytes:
        return pickle.dumps(([(n, None)], None))

    ch = InputChannel(0, 2, threading.Event())
    ch.put_blocking(frame(1))
    ch.put_blocking(frame(2))
    t = threading.Thread(target=ch.put_blocking, args=(frame(3),))
    t.start()
    t.join(0.2)
    assert t.is_alive() and ch.backlog() == 2  # blocked: full
    assert ch.poll() == ([(1, None)], None)  # remote frames come out unpickled
    t.join(5)
    assert not t.is_alive()
    assert [ch.poll(), ch.poll(), ch.poll()] == [([(2, None)], None), ([(3, None)], None), None]


# -- file sink -----------------------------------------------------------------------------------


class _Ctx:
    subtask, parallelism, max_parallelism, run_id, attempt = 0, 1, 128, "abcdef0123", 1


def test_file_sink_two_phase_commit_and_recovery(tmp_path: Path) -> None:
    op = FileSinkOperator("out", tmp_path, json.dumps)
    op.setup(_Ctx(), None)  # type: ignore[arg-type]
    op.open()
    op.process([1], None, 0)
    op.snapshot(5)  # pre-commit: pending, invisible
    op.process([2], None, 0)
    op.snapshot(6)
    op.process([3], None, 0)  # in progress
    assert read_committed(tmp_path) == []
    op.checkpoint_complete(5)
    assert read_committed(tmp_path) == [[1]]
    assert len(list((tmp_path / PENDING_DIR).iterdir())) == 1
    # a failure: the job restarts from checkpoint 5 -> txn 6 is aborted, in-progress dropped
    FileSink(tmp_path).recover(5)
    assert read_committed(tmp_path) == [[1]]
    assert list((tmp_path / PENDING_DIR).iterdir()) == []
    assert list((tmp_path / ".inprogress").iterdir()) == []
    # recovery commits what belongs to the restored checkpoint and is idempotent
    op2 = FileSinkOperator("out", tmp_path, json.dumps)
    op2.setup(_Ctx(), None)  # type: ignore[arg-type]
    op2.open()
    op2.process([4], None, 0)
    op2.snapshot(7)
    FileSink(tmp_path).recover(7)
    FileSink(tmp_path).recover(7)
    op2.checkpoint_complete(7)  # a late notification finds it committed
    assert read_committed(tmp_path) == [[1], [4]]
    assert read_committed(tmp_path, upto_checkpoint=6) == [[1]]


# -- coordinator ---------------------------------------------------------------------------------


class _StubHistory:
    """The job's checkpoint history, as the coordinator calls it: the failures it records."""

    def __init__(self) -> None:
        self.failed: list[tuple[int | None, str, dict[str, Any]]] = []

    def record_failure(self, checkpoint_id: int | None, reason: str, **extra: Any) -> bool:
        self.failed.append((checkpoint_id, reason, extra))
        return True


class _StubJob:
    def __init__(self) -> None:
        self.published: list[int] = []
        self.checkpoint_history = _StubHistory()

    def publish_checkpoint(self, cid: int, handles: Any, sources: Any, stats: Any) -> Any:
        from statelog.checkpoint.metadata import CheckpointMetadata

        self.published.append(cid)
        return CheckpointMetadata(cid, "job", 0, 128, dict(sources), {}, dict(stats))


def test_coordinator_records_a_published_checkpoint_even_if_the_notification_fails() -> None:
    from runtime.cluster.coordinator import CheckpointCoordinator
    from runtime.errors import WorkerLostError

    sent: list[Any] = []
    completed: list[int] = []

    def broadcast(msg: Any) -> None:
        sent.append(msg)
        if msg[0] == "complete":
            raise WorkerLostError("worker 1 is unreachable")

    job = _StubJob()
    c = CheckpointCoordinator(
        job, {"0.0", "1.0"}, interval_s=1.0, timeout_s=10.0, tolerable_failures=0, first_id=7,
        broadcast=broadcast, on_complete=lambda m: completed.append(m.checkpoint_id), attempt=1, mode="x",
    )
    c.tick(c.next_trigger)
    assert sent == [("trigger", 7)]
    c.ack(7, "0.0", [], {"src": {"0000": {"next": 3}}}, {"records": 3})
    c.ack(8, "1.0", [], None, {})  # not the pending checkpoint: ignored
    with pytest.raises(WorkerLostError):
        c.ack(7, "1.0", [], {"src": {"0001": {"next": 4}}}, {"records": 4})
    assert job.published == [7] and completed == [7]


def test_coordinator_fails_the_job_after_too_many_failed_checkpoints() -> None:
    from runtime.cluster.coordinator import CheckpointCoordinator
    from runtime.errors import CheckpointFailureLimitError

    sent: list[Any] = []
    job = _StubJob()
    c = CheckpointCoordinator(
        job, {"0.0"}, interval_s=0.1, timeout_s=10.0, tolerable_failures=1, first_id=1,
        broadcast=sent.append, on_complete=lambda m: None, attempt=1, mode="x",
    )
    c.tick(c.next_trigger)
    c.decline(1, "0.0", "disk full")
    assert sent[-1] == ("abort", 1) and c.pending is None
    c.tick(c.next_trigger + 1)
    c.ack(2, "0.0", [], None, {})  # a success resets the count
    c.tick(c.next_trigger + 1)
    c.decline(3, "0.0", "disk full")
    c.tick(c.next_trigger + 1)
    with pytest.raises(CheckpointFailureLimitError, match="2 checkpoints failed in a row"):
        c.tick(c.pending.started + 11)  # type: ignore[union-attr]  # checkpoint 4 times out
    # every failed checkpoint is in the root's checkpoint history, with its reason and attempt
    failed = job.checkpoint_history.failed
    assert [f[0] for f in failed] == [1, 3, 4]
    assert failed[0][1] == "declined by task 0.0: disk full" and failed[0][2]["attempt"] == 1


# -- unaligned checkpoints -------------------------------------------------------------------------


def test_unaligner_starts_at_the_first_barrier_and_finishes_at_the_last() -> None:
    from runtime.network.barriers import BarrierUnaligner

    u = BarrierUnaligner(3)
    assert u.on_barrier_unaligned(1, 5) == ["start"]
    assert u.recording and u.waiting == {0, 2} and not u.blocked  # nothing blocks
    assert u.on_barrier_unaligned(1, 5) == []  # duplicate
    assert u.on_barrier_unaligned(0, 5) == []
    assert u.on_barrier_unaligned(2, 5) == ["done"]
    assert not u.recording and u.on_barrier_unaligned(0, 5) == []  # already done
    single = BarrierUnaligner(1)
    assert single.on_barrier_unaligned(0, 1) == ["start", "done"]
    # a newer barrier while recording: the older checkpoint was aborted
    assert u.on_barrier_unaligned(0, 6) == ["start"]
    assert u.on_barrier_unaligned(1, 7) == ["abandon", "start"]
    assert u.on_barrier_unaligned(1, 6) == []
    assert u.abort(7) and not u.recording
    assert u.on_barrier_unaligned(0, 7) == []


def test_unaligner_aligns_on_finished_channels_so_the_final_checkpoint_is_aligned() -> None:
    from runtime.network.barriers import BarrierUnaligner

    u = BarrierUnaligner(3)
    assert u.on_barrier_unaligned(0, 1, finished=True) == []
    assert u.blocked == {0} and not u.recording
    assert u.on_barrier_unaligned(1, 1, finished=False) == ["start"]  # an unfinished input starts it
    assert not u.blocked and u.waiting == {2}
    assert u.on_barrier_unaligned(2, 1) == ["done"]
    # every input finished (final checkpoint): snapshot at the last barrier, like aligned
    assert u.on_barrier_unaligned(0, 2, finished=True) == []
    assert u.on_barrier_unaligned(1, 2, finished=True) == []
    assert u.blocked == {0, 1}
    assert u.on_barrier_unaligned(2, 2, finished=True) == ["start", "done"]
    assert not u.blocked


def test_inflight_objects_are_checksummed_versioned_and_redistributed(tmp_path: Path) -> None:
    from runtime.errors import RuntimeJobError
    from runtime.graph import JobEdge
    from runtime.network import inflight
    from statelog.store import open_store

    store = open_store(f"file://{tmp_path}/root")
    keys = [f"k{i}" for i in range(40)]
    sources: dict[str, Any] = {"src": {"0": 1}}
    for sub in range(2):
        payload = {"version": 1, "checkpoint": 3, "task": f"4.{sub}", "vertex": 4, "subtask": sub, "parallelism": 2,
                   "input": [(9, 0, (k, sub), None) for k in keys] + [(8, 1, ("fwd", sub), 7)],
                   "output": [(0, ("out", sub), None)]}
        data, digest = inflight.encode(payload)
        key = layout.inflight_key(3, f"4.{sub}")
        assert key == f"runtime/inflight/chk-3/4.{sub}.bin"
        store.put(key, data)
        sources.setdefault(inflight.INFLIGHT_KEY, {})[f"4.{sub}"] = {
            "key": key, "sha256": digest, "version": 1, "parallelism": 2}
    edges = {9: JobEdge(9, 1, 4, HASH, lambda v: v[0], 0), 8: JobEdge(8, 2, 4, FORWARD, None, 1)}
    # same parallelism: each task its own object
    data_in, data_out = inflight.replay_for(store, sources, 4, 1, 2, 128, edges)
    assert data_out == [(0, ("out", 1), None)] and len(data_in) == 41
    assert inflight.replay_for(store, sources, 5, 0, 2, 128, edges) == ([], [])  # another vertex
    # parallelism 3: hash records by key group, forward records and output by old subtask % 3
    for new in range(3):
        data_in, data_out = inflight.replay_for(store, sources, 4, new, 3, 128, edges)
        for _e, idx, v, _t in data_in:
            if idx == 0:
                assert subtask_for_key_group(128, 3, key_group_of(v[0], 128)) == new
            else:
                assert v[1] % 3 == new
        assert [o[1][1] for o in data_out] == [s for s in range(2) if s % 3 == new]
    total = sum(len(inflight.replay_for(store, sources, 4, n, 3, 128, edges)[0]) for n in range(3))
    assert total == 82
    # corruption, a replaced object and an unknown version are refused
    raw = store.get(layout.inflight_key(3, "4.0"))
    store.delete(layout.inflight_key(3, "4.0"))  # objects are write-once
    store.put(layout.inflight_key(3, "4.0"), raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(RuntimeJobError, match="checksum"):
        inflight.replay_for(store, sources, 4, 0, 2, 128, edges)
    with pytest.raises(RuntimeJobError, match="version"):
        inflight.decode(raw[:4] + b"\x09" + raw[5:], "x")
    other, _ = inflight.encode({"input": [], "output": []})
    store.delete(layout.inflight_key(3, "4.0"))
    store.put(layout.inflight_key(3, "4.0"), other)
    with pytest.raises(RuntimeJobError, match="checksum"):
        inflight.read_all(store, sources)


def test_inflight_cleanup_and_the_materializer_gc(tmp_path: Path) -> None:
    import statelog
    from materializer.gc.collect import collect_garbage
    from runtime.network import inflight

    root = f"file://{tmp_path}/root"
    with statelog.open(root, retain_checkpoints=2) as job:
        b = job.backend("op")
        for cid in range(1, 5):
            b.set_current_key("k")
            job.checkpoint({"s": {"0": cid}})
            job.store.put(layout.inflight_key(cid, "1.0"), b"x")
        job.store.put(layout.inflight_key(9, "1.0"), b"x")  # a checkpoint still in flight
        retained = job.catalog.checkpoint_ids()
        assert retained == [3, 4]
        collect_garbage(job.store, grace_s=0.0)
        names = sorted(i.key for i in job.store.list(layout.INFLIGHT_PREFIX))
        assert len(names) == 5  # the materializer's GC never touches runtime/
        assert inflight.collect_inflight(job.store, retained, 4) == [1, 2]
        names = sorted(i.key for i in job.store.list(layout.INFLIGHT_PREFIX))
        assert names == [layout.inflight_key(c, "1.0") for c in (3, 4, 9)]
