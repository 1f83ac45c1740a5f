"""Buffer debloating (runtime/network/debloat.py, the channels' bounds and reports) and urgent barriers
in unaligned mode (a barrier overtakes what its own channel queues; exactly the overtaken
frames are persisted as in-flight data)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runtime import (
    CollectSink,
    FixedDelay,
    GeneratorSource,
    KeyedProcessFunction,
    StreamExecutionEnvironment,
)
from runtime.config import JobConfig
from runtime.graph import FORWARD
from runtime.network import inflight
from runtime.network.auth import new_secret
from runtime.network.debloat import FLOOR_RECORDS, PERIOD_S, Debloater
from runtime.network.frames import BARRIER
from runtime.network.input_channel import InputChannel
from runtime.network.outputs import LocalOutput, RemoteOutput
from runtime.network.router import EdgeOutput, Router
from runtime.network.server import ChannelServer
from runtime.task.operators import StreamOperator
from runtime.task.task import Task
from statelog.errors import ConfigError
from tests.support.metrics import scrape
from tests.support.s3server import RootSpec

SECRET = new_secret()  # the channels' job secret (runtime.network.auth)

# -- the debloater -------------------------------------------------------------------------------


def test_bound_follows_the_consumers_busy_throughput() -> None:
    d = Debloater(target_s=0.5, ceiling_frames=32, batch_size=100)
    assert (d.frames, d.records) == (32, 3200)  # the ceiling until measured
    t = d._t0
    # 1000 records in 0.25 s of which 0.05 s idle: 5000 records per busy second
    for _ in range(9):
        assert not d.consumed(100, 0, t + 0.1)
    d.idle(0.05)
    assert d.consumed(100, 0, t + 0.25)  # the period ended
    assert d.rate == pytest.approx(5000)
    assert d.records == 2500  # 5000/s x 0.5 s
    assert d.frames == 25
    # the consumer slows down to 400 records per second: the bound follows (smoothed)
    for _ in range(12):
        t0 = d._t0
        for _ in range(3):
            d.consumed(25, 2500, t0 + 0.1)
        d.consumed(25, 2500, t0 + 0.25)
    assert d.rate == pytest.approx(400, rel=0.02)
    assert d.records == pytest.approx(200, rel=0.05)
    assert 8 <= d.frames <= 9  # 25 records per frame now
    assert d.bytes == pytest.approx(d.records * 100, rel=0.01)  # 100 pickled bytes per record


def test_bound_stays_within_floor_and_ceiling_and_idle_periods_say_nothing() -> None:
    d = Debloater(target_s=0.001, ceiling_frames=8, batch_size=256)
    t = d._t0
    d.consumed(10, 0, t + 1.0)  # 10 records per second x 1 ms
    assert d.records == FLOOR_RECORDS and d.frames == 1
    fast = Debloater(target_s=10.0, ceiling_frames=8, batch_size=256)
    t = fast._t0
    fast.consumed(256, 0, t + 0.001)
    fast.consumed(256, 0, t + PERIOD_S + 0.01)
    assert fast.records == fast.ceiling_records == 8 * 256 and fast.frames == 8
    # a period in which the channel was empty all along leaves the bound as it was
    before = (fast.records, fast.frames, fast.rate)
    t = fast._t0
    fast.idle(PERIOD_S + 0.01)
    fast.consumed(1, 0, t + PERIOD_S + 0.01)
    assert (fast.records, fast.frames, fast.rate) == before


def test_in_process_channel_room_follows_the_bound() -> None:
    d = Debloater(target_s=0.1, ceiling_frames=32, batch_size=10)
    ch = InputChannel(0, 8, threading.Event(), d)
    out = LocalOutput(ch)
    d.records, d.frames = 25, 3
    assert out.frame_limit(10) == 10
    for _ in range(2):
        assert out.has_room()
        out.send(([(1, None)] * 10, None))
    assert out.has_room()  # 20 records, 2 frames
    out.send(([(1, None)] * 10, None))
    assert not out.has_room()  # 30 records > 25
    assert ch.poll() is not None and out.has_room()
    d.records = 6
    assert out.frame_limit(10) == 3  # smaller frames for a smaller bound
    assert out.buffered() == (2, 20)


def _back_pressured_channel(ceiling_frames: int, bound: tuple[int, int]) -> tuple[ChannelServer, InputChannel, RemoteOutput, list[str]]:  # fmt: skip
    """A remote channel over a real connection whose receiver's bound (frames, records) is
    below its ceiling; returned once the sender learned the bound (the receiver reports it
    when the connection is attached)."""
    errors: list[str] = []
    server = ChannelServer(errors.append, SECRET)
    d = Debloater(target_s=1.0, ceiling_frames=ceiling_frames, batch_size=4)
    ceiling = (d.frames, d.records)
    d.frames, d.records = bound
    ch = InputChannel(0, 1000, threading.Event(), d)
    server.channels[(0, 0, 1)] = ch
    server.ready.set()
    out = RemoteOutput(server.address, (0, 0, 1), errors.append, threading.Event(), 1, ceiling, secret=SECRET)
    deadline = time.monotonic() + 10
    while (out.bound_frames, out.bound_records) != bound and time.monotonic() < deadline:
        time.sleep(0.01)
    if (out.bound_frames, out.bound_records) != bound:
        out.close()
        server.close()
        raise AssertionError(f"the sender did not learn the bound {bound}: {errors}")
    return server, ch, out, errors


def test_a_remote_channel_at_its_ceiling_goes_by_the_sender_queue_and_reports_only_changes() -> None:
    """Without back-pressure the bound stays at the ceiling: the sender counts its own queue
    (``capacity`` frames), as without debloating, and the receiver reports no consumption
    (only a change of its bound), so no report crosses the connection per frame."""
    errors: list[str] = []
    server = ChannelServer(errors.append, SECRET)
    d = Debloater(target_s=1.0, ceiling_frames=4, batch_size=4)
    ch = InputChannel(0, 1000, threading.Event(), d)
    server.channels[(0, 0, 1)] = ch
    server.ready.set()
    out = RemoteOutput(server.address, (0, 0, 1), errors.append, threading.Event(), 2, (d.frames, d.records),
                       secret=SECRET)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        for i in range(12):  # 12 frames > the ceiling of 4: the queue drains into the connection
            while not out.has_room() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert out.has_room()
            out.send(([(i, None)], None))
        taken = []
        while len(taken) < 12 and time.monotonic() < deadline:
            f = ch.poll()
            if f is None:
                time.sleep(0.005)
            else:
                taken.append(f[0][0][0])
        assert taken == list(range(12))
        time.sleep(0.1)
        assert out.consumed_frames == 0  # no consumption report: the bound did not change
        d._t0 -= 1.0  # a period ends at the next frame: the bound is measured and reported
        out.send(([(12, None)], None))
        while ch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        while out.consumed_frames != 13 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert out.consumed_frames == 13
    finally:
        out.close()
        server.close()
    assert errors == []


def test_a_router_never_fills_a_debloated_channel_beyond_its_bound() -> None:
    """The router asks for room for a whole frame (up to half the records bound), so what a
    channel holds stays within the bound instead of passing it by up to a frame."""
    d = Debloater(target_s=0.1, ceiling_frames=32, batch_size=10)
    ch = InputChannel(0, 8, threading.Event(), d)
    d.records, d.frames = 25, 8
    edge = EdgeOutput(FORWARD, None, [LocalOutput(ch)], 128, batch_size=10)
    router = Router([edge], 8)
    sent = 0
    for i in range(200):
        if not router.has_capacity():
            break
        edge.emit(i, None)
        sent += 1
        assert ch.queued_records <= d.records
    assert edge.limits == [10]  # frames of at most 25 // 2 = 12 records, cut at the batch size
    assert ch.queued_records == 20 and sent == 20  # a third frame could pass 25: no room
    assert not router.has_capacity()
    ch.poll()
    assert router.has_capacity()  # 10 queued + a frame of 10 <= 25


def test_remote_channel_counts_the_queue_and_the_connection() -> None:
    """Over a real loopback connection: the sender's room is the receiver's bound minus what it
    sent and the receiver did not take yet, whatever sits in its queue or the TCP buffers."""
    server, ch, out, errors = _back_pressured_channel(8, (4, 16))
    try:
        sent = 0
        while out.has_room():
            out.send(([(sent, None)], None))
            sent += 1
        assert sent == 4  # the bound: 4 frames (16 records) in the queue, the connection, the receiver
        deadline = time.monotonic() + 10
        while ch.backlog() < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ch.backlog() == 4 and not out.has_room()  # nothing taken yet: still full
        assert ch.poll() == ([(0, None)], None)
        while not out.has_room() and time.monotonic() < deadline:
            time.sleep(0.01)  # the receiver's report arrives on the same connection
        assert out.consumed_frames == 1 and out.buffered() == (3, 3)
    finally:
        out.close()
        server.close()
    assert errors == []


@pytest.mark.parametrize(
    "records_per_frame, blocked_after",
    [(1, 16), (30, 3)],  # the frames bound binds (16 frames); the records bound binds (64 records)
    ids=["frames-bound", "records-bound"],
)
def test_a_blocked_remote_sender_gets_room_once_the_receiver_took_its_frames(
    records_per_frame: int, blocked_after: int
) -> None:
    """The receiver reports consumption every quarter of the bound, not after every frame; a
    sender blocked by either bound still learns that everything it sent was taken."""
    server, ch, out, errors = _back_pressured_channel(32, (16, 64))
    try:
        sent = 0
        while out.has_room():
            out.send(([(sent, None)] * records_per_frame, None))
            sent += 1
        assert sent == blocked_after
        deadline = time.monotonic() + 10
        taken = 0
        while taken < sent and time.monotonic() < deadline:
            if ch.poll() is not None:
                taken += 1
            else:
                time.sleep(0.005)
        assert taken == sent
        while not out.has_room() and time.monotonic() < deadline:
            time.sleep(0.01)  # no more frames come: the reports already sent must free the room
        assert out.has_room(), f"sender still blocked: {out.buffered()} unconsumed as far as it knows"
        assert out.consumed_frames >= 1
    finally:
        out.close()
        server.close()
    assert errors == []


def test_buffer_debloat_target_is_validated(tmp_path: Any) -> None:
    root = (tmp_path / "root").as_uri()
    assert StreamExecutionEnvironment(state_root=root).config.buffer_debloat_target == 1.0
    assert StreamExecutionEnvironment(state_root=root, buffer_debloat_target="200ms").config.buffer_debloat_target == 0.2
    assert StreamExecutionEnvironment(state_root=root, buffer_debloat_target=None).config.buffer_debloat_target is None
    with pytest.raises(ConfigError, match="buffer_debloat_target must be in"):
        StreamExecutionEnvironment(state_root=root, buffer_debloat_target=0)
    with pytest.raises(ConfigError, match="max_inflight_bytes"):
        StreamExecutionEnvironment(state_root=root, max_inflight_bytes=-1)


# -- urgent barriers (unaligned mode) --------------------------------------------------------------


class _Host:
    def __init__(self) -> None:
        self.config = JobConfig()
        self.batch_size = 256
        self.acks: list[dict[str, Any]] = []
        self.sent: list[Any] = []

    def send(self, msg: tuple[Any, ...]) -> None:
        self.sent.append(msg)

    def acknowledge_async(self, checkpoint_id: int, task: str, pending: list[Any], sources: Any, stats: Any, *,
                          blob: Any = None, held: bool = False) -> None:  # fmt: skip
        self.acks.append({"id": checkpoint_id, "sources": sources, "stats": stats, "blob": blob})

    def hold_async(self) -> None:
        pass

    def release_async(self) -> None:
        pass


class _Forward(StreamOperator):
    """Forwards and remembers what it processed."""

    def __init__(self) -> None:
        super().__init__(uid=None, name="forward")
        self.seen: list[Any] = []

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        self.seen.append(value)
        self.out.emit(value, ts)


def _frame(*values: Any, event: Any = None) -> tuple[list[Any], Any]:
    return [(v, None) for v in values], event


def _task(host: _Host, channels: list[InputChannel], outputs: list[Any]) -> tuple[Task, _Forward]:
    op = _Forward()
    router = Router([EdgeOutput(FORWARD, None, outputs, 128, batch_size=256)], 8)
    op.setup(None, router)  # type: ignore[arg-type]
    task = Task(host, "1.0", 1, [op], router, channels=channels, channel_inputs=[0] * len(channels),
                unaligned=True, channel_edges=[7] * len(channels))  # fmt: skip
    return task, op


def _payload(ack: dict[str, Any]) -> dict[str, Any]:
    key, data = ack["blob"]
    return inflight.decode(data, key)


def test_urgent_barrier_persists_exactly_the_frames_it_overtook_at_the_receiver() -> None:
    host = _Host()
    a, b = InputChannel(0, 100, threading.Event()), InputChannel(1, 100, threading.Event())
    down = InputChannel(0, 100, threading.Event())
    task, op = _task(host, [a, b], [LocalOutput(down)])
    a.put(_frame("a0"))
    task.step()  # a0 processed before the checkpoint: in its snapshot, not in flight
    a.put(_frame("a1", "a2"))
    a.put(_frame("a3"))
    b.put(_frame("b1"))
    a.put_urgent(_frame(event=(BARRIER, 1)))
    a.put(_frame("a4"))  # behind the barrier
    # the task handles the urgent barrier first: snapshot, barrier out urgent to ``down``
    task.step()
    assert down.urgent and down.urgent[0][0] == _frame(event=(BARRIER, 1))
    assert down.urgent[0][1] == 1  # overtakes the one frame (a0) the task had sent before
    while task.step():
        pass
    assert sorted(op.seen) == ["a0", "a1", "a2", "a3", "a4", "b1"]
    assert host.acks == []  # channel b's barrier is still due
    b.put(_frame("b2"))
    b.put_urgent(_frame(event=(BARRIER, 1)))
    b.put(_frame("b3"))
    while task.step():
        pass
    (ack,) = host.acks
    payload = _payload(ack)
    # in flight: a1..a3 (queued before barrier 1 on a), b1 (processed while b's barrier was due),
    # b2 (queued before barrier 1 on b); never a0 (before the snapshot) nor a4, b3 (after)
    assert sorted(v for _e, _i, v, _t in payload["input"]) == ["a1", "a2", "a3", "b1", "b2"]
    assert all(e == 7 and i == 0 for e, i, _v, _t in payload["input"])
    assert payload["output"] == []
    assert ack["stats"]["inflight_records"] == 5
    assert ack["sources"][inflight.INFLIGHT_KEY]["1.0"]["input"] == 5


def test_restored_inflight_data_is_replayed_before_a_waiting_urgent_barrier() -> None:
    """A task restored from an unaligned checkpoint replays that checkpoint's in-flight records
    before anything else, also when the first barrier of the new run already waits urgently on
    an input: the records belong before every new checkpoint. (Handled after the barrier, they
    went downstream behind it: the next checkpoint held them neither in a snapshot nor in
    flight, and a restore of it lost them; seen as lost join results in the runtime's
    unaligned crash loop.)"""
    host = _Host()
    a, b = InputChannel(0, 100, threading.Event()), InputChannel(1, 100, threading.Event())
    down = InputChannel(0, 100, threading.Event())
    task, op = _task(host, [a, b], [LocalOutput(down)])
    task.replay = ([(7, 0, "r1", None), (7, 0, "r2", None)], [])
    a.put_urgent(_frame(event=(BARRIER, 2)))
    a.put(_frame("a1"))
    b.put_urgent(_frame(event=(BARRIER, 2)))
    while task.step():
        pass
    # downstream, barrier 2 overtakes the frame of the replayed records, which it sent before:
    # the downstream task persists them as in-flight input of checkpoint 2
    (barrier,) = down.urgent
    assert barrier == (_frame(event=(BARRIER, 2)), 1)
    assert down.poll() == _frame("r1", "r2")
    assert op.seen == ["r1", "r2", "a1"]
    (ack,) = host.acks  # nothing of its own in flight: both barriers were first on their inputs
    assert ack["id"] == 2 and ack["blob"] is None


def test_frames_behind_an_urgent_barrier_wait_for_it() -> None:
    ch = InputChannel(0, 100, threading.Event())
    ch.put(_frame(1))
    ch.put_urgent(_frame(event=(BARRIER, 1)))
    ch.put(_frame(2))
    assert ch.poll() == _frame(1)
    assert ch.poll() is None  # frame 2 is behind the barrier: not before the task handled it
    assert ch.urgent.popleft() == (_frame(event=(BARRIER, 1)), 1)
    assert ch.poll() == _frame(2)


def _receive(recv: InputChannel, records: int, checkpoint_id: int) -> tuple[list[Any], int]:
    """Take ``records`` records from ``recv`` as a task would; returns them and how many came
    before the urgent barrier ``checkpoint_id``."""
    received: list[Any] = []
    barrier_at = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (barrier_at is None or len(received) < records):
        if recv.urgent and barrier_at is None and recv.polls >= recv.urgent[0][1]:
            frame, _puts_at = recv.urgent.popleft()
            assert frame == _frame(event=(BARRIER, checkpoint_id))
            barrier_at = len(received)
            continue
        frame = recv.poll()
        if frame is None:
            time.sleep(0.001)
            continue
        received.extend(v for v, _t in frame[0])
    assert barrier_at is not None and len(received) == records
    return received, barrier_at


def test_urgent_barrier_overtakes_the_remote_senders_queue() -> None:
    """The frames still in a remote output's queue go behind the barrier and into the
    checkpoint as output; everything the receiver got before the barrier was sent before it."""
    errors: list[str] = []
    server = ChannelServer(errors.append, SECRET)
    recv = InputChannel(0, 1, threading.Event())  # a slow receiver: 1 frame, then TCP fills up
    server.channels[(3, 0, 1)] = recv
    server.ready.set()
    out = RemoteOutput(server.address, (3, 0, 1), errors.append, None, 10_000, secret=SECRET)
    host = _Host()
    a = InputChannel(0, 100, threading.Event())
    task, _op = _task(host, [a], [out])
    try:
        values = [f"r{i:05d}-" + "x" * 200 for i in range(4000)]
        for k in range(0, len(values), 100):
            out.send(_frame(*values[k:k + 100]))
        time.sleep(0.2)
        a.put(_frame("late"))  # processed after the barrier: not part of the checkpoint
        a.put_urgent(_frame(event=(BARRIER, 5)))
        task.step()
        (ack,) = host.acks  # one channel: first and last barrier at once
        output = [v for _k, v, _t in _payload(ack)["output"]]
        assert output, "nothing was left in the sender's queue: the test did not exercise overtaking"
        received, barrier_at = _receive(recv, len(values) + 1, 5)
        # the receiver got the sent frames in order, minus the overtaken ones before the barrier,
        # then the overtaken ones (exactly the persisted output), then the task's later output
        assert received[:barrier_at] + output == values
        assert received[barrier_at:] == output + ["late"]
    finally:
        out.close()
        server.close()
    assert errors == []


def test_taking_the_queue_is_atomic_against_the_sender_thread() -> None:
    """An urgent barrier takes a remote output's queued frames (they go behind it) while the
    sender thread takes frames from the same queue: the sender must get only frames before
    all of those taken, or it sends one ahead of earlier ones and breaks the channel's order
    (taking them one by one did so now and then: a flaky failure of the next test)."""
    import socket
    import sys

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()  # nothing listens: the output's own sender thread never gets to its queue
    out = RemoteOutput(("127.0.0.1", closed_port), (0, 0, 1), lambda e: None, None, 10, secret=SECRET)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(30):
            for i in range(3000):
                out.q.put(i)
            sent: list[int] = []

            def sender(sent: list[int]) -> None:
                while (x := out.q.get()) != "stop":
                    sent.append(x)

            t = threading.Thread(target=sender, args=(sent,))
            t.start()
            taken = out.take_queued()
            out.q.put("stop")
            t.join()
            assert sorted(sent + taken) == list(range(3000))
            assert taken == sorted(taken)
            assert not sent or not taken or max(sent) < min(taken), (len(sent), len(taken))
    finally:
        sys.setswitchinterval(interval)
        out.close()


def test_a_sources_urgent_barrier_overtakes_its_queue_and_stores_it_as_output() -> None:
    """A source task in unaligned mode: the records it read before its positions but still
    queues go behind the barrier and into the checkpoint; a restore re-emits them first."""
    errors: list[str] = []
    server = ChannelServer(errors.append, SECRET)
    recv = InputChannel(0, 1, threading.Event())
    server.channels[(0, 0, 1)] = recv
    server.ready.set()
    out = RemoteOutput(server.address, (0, 0, 1), errors.append, None, 10_000, secret=SECRET)
    host = _Host()
    splits = GeneratorSource(_pair, 100_000, splits=1).open_splits({"0000": None}, None)
    router = Router([EdgeOutput(FORWARD, None, [out], 128, batch_size=256)], 8)
    task = Task(host, "0.0", 0, [], router, source=splits, source_uid="pairs", unaligned=True)
    try:
        while splits.emitted < 20_000:
            task.step()
        task.checkpoint(2)
        (ack,) = host.acks
        position = ack["sources"]["pairs"]["0000"]["next"]
        output = [v for _k, v, _t in _payload(ack)["output"]]
        assert output, "nothing was left in the source's queue: the test did not exercise overtaking"
        assert ack["sources"][inflight.INFLIGHT_KEY]["0.0"]["output"] == len(output)
        values = [_pair(0, i) for i in range(position)]
        received, barrier_at = _receive(recv, position, 2)
        assert received[:barrier_at] + output == values  # before the barrier: all but the overtaken
        assert received[barrier_at:] == output  # then exactly the stored ones
        # restored from it, a source task re-emits the stored output before it reads on
        host2 = _Host()
        collected: list[Any] = []

        class _Out:
            label, backpressured_s = "x", 0.0

            def send(self, frame: Any) -> None:
                collected.extend(v for v, _t in frame[0])

            def has_room(self, frame_records: int = 1) -> bool:
                return True

            def frame_limit(self, batch_size: int) -> int:
                return batch_size

        splits2 = GeneratorSource(_pair, 100_000, splits=1).open_splits({"0000": {"next": position}}, None)
        router2 = Router([EdgeOutput(FORWARD, None, [_Out()], 128, batch_size=256)], 8)  # type: ignore[list-item]
        task2 = Task(host2, "0.0", 0, [], router2, source=splits2, source_uid="pairs", unaligned=True)
        task2.replay = ([], _payload(ack)["output"])
        task2.step()
        assert collected == output
        task2.step()
        assert collected[len(output)] == _pair(0, position)
    finally:
        out.close()
        server.close()
    assert errors == []


# -- the in-flight size cap ------------------------------------------------------------------------


def test_a_task_whose_inflight_data_exceeds_the_cap_declines() -> None:
    host = _Host()
    host.config = JobConfig(max_inflight_bytes=50)
    a = InputChannel(0, 100, threading.Event())
    task, _op = _task(host, [a], [LocalOutput(InputChannel(0, 100, threading.Event()))])
    a.put(_frame(*[f"record-{i}" for i in range(20)]))
    a.put_urgent(_frame(event=(BARRIER, 3)))
    task.step()
    assert host.acks == []  # not acknowledged, nothing written
    (decline,) = [m for m in host.sent if m[0] == "decline"]
    assert decline[1:3] == (3, "1.0")
    assert "exceeds max_inflight_bytes=50" in decline[3] and "buffer_debloat_target" in decline[3]
    # the next checkpoint is recorded as usual
    host.config = JobConfig()
    a.put_urgent(_frame(event=(BARRIER, 4)))
    task.step()
    assert [ack["id"] for ack in host.acks] == [4]


def test_the_coordinator_fails_a_checkpoint_whose_inflight_data_exceeds_the_cap() -> None:
    from runtime.cluster.coordinator import CheckpointCoordinator
    from runtime.errors import CheckpointFailureLimitError

    sent: list[Any] = []
    coord = CheckpointCoordinator(
        None, {"1.0", "1.1"}, interval_s=1.0, timeout_s=60.0, tolerable_failures=1, first_id=1,  # type: ignore[arg-type]
        broadcast=sent.append, on_complete=lambda meta: None, attempt=1, mode="exactly_once_unaligned",
        max_inflight_bytes=100,
    )  # fmt: skip
    coord.tick(time.monotonic() + 2)
    assert sent == [("trigger", 1)]
    coord.ack(1, "1.0", [], None, {"inflight_bytes": 60})
    assert coord.pending is not None  # 60 bytes so far: within the cap
    coord.ack(1, "1.1", [], None, {"inflight_bytes": 50})
    assert coord.pending is None and sent[-1] == ("abort", 1) and coord.failed_total == 1
    coord.tick(time.monotonic() + 4)
    # a second failure in a row is more than tolerable: the job fails, saying why
    with pytest.raises(CheckpointFailureLimitError, match=r"in-flight data of 101 bytes from 1 task\(s\) exceeds"):
        coord.ack(2, "1.0", [], None, {"inflight_bytes": 101})


# -- per-channel metrics ---------------------------------------------------------------------------


def _pair(split: int, i: int) -> tuple[int, int]:
    return (i % 50, i)


def _first(e: tuple[int, int]) -> int:
    return e[0]


class _SlowCount(KeyedProcessFunction):
    """About 1000 records per second per subtask."""

    def process_element(self, e: Any, ctx: Any) -> None:
        time.sleep(0.001)


@pytest.mark.slow
def test_channel_metrics_of_a_back_pressured_job(file_root: RootSpec, tmp_path: Path) -> None:

    env = StreamExecutionEnvironment(
        parallelism=2, checkpoint_interval_s=0.3, state_root=file_root.url, metrics_port=0,
        buffer_debloat_target=0.1, restart_strategy=FixedDelay(attempts=0, delay_s=0.0),
    )  # fmt: skip
    src = env.from_source(GeneratorSource(_pair, 4000, splits=2), uid="pairs")
    src.key_by(_first).process(_SlowCount(), uid="slow").sink_to(CollectSink(), uid="out")
    client = env.execute_async("channel-metrics")
    assert client.wait_running(1, timeout=60)
    server = client.master.metrics_server
    assert server is not None
    channels: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + 60
    while not client.done and time.monotonic() < deadline:
        try:
            scraped = scrape(server.url)
        except OSError:  # the job ended meanwhile: its server stopped
            break
        for (name, labels), v in scraped.items():
            if name.startswith("statelog_job_channel_"):
                channels.setdefault(dict(labels)["channel"], {})[name[len("statelog_job_channel_"):]] = v
        time.sleep(0.2)
    client.wait(60)
    # the hash edge from the sources (edge 0) to ``slow``: 2 x 2 channels, each end reported
    assert sorted(channels) == ["0.0-0", "0.0-1", "0.1-0", "0.1-1"], sorted(channels)
    for values in channels.values():
        assert {"bound_records", "bound_frames", "buffered_records", "buffered_frames",
                "backpressured_seconds_total"} <= set(values), values  # fmt: skip
        assert 16 <= values["bound_records"] <= 4 * 8 * 256  # the remote ceiling
    # the slow consumer takes about 500 records per second and channel: debloated to about 50
    assert min(v["bound_records"] for v in channels.values()) < 500
    assert sum(v["backpressured_seconds_total"] for v in channels.values()) > 0
