"""A user's consumer loop (``tests/support/kafka/consumer_loop_worker.py``) with statelog state,
SIGKILLed at random points and restarted.

Keyed counts and sums of records produced beforehand; the loop checkpoints every ``EVERY``
records with its Kafka offsets (:class:`statelog.kafka.KafkaOffsets`). After the last
restart has read everything, the state at every completed checkpoint equals the model: the
fold of exactly the records before that checkpoint's offsets (no loss, no duplicates), and
its offsets come back as ``{int partition: int offset}``. A second process on the same root
is refused while the first runs.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import statelog
from tests.support.kafka.broker import KafkaBroker
from tests.support.kafka.consumer_loop_worker import COUNT, OPERATOR, TOTAL

ck = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.kafka]

logger = logging.getLogger(__name__)
PROJECT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
RECORDS = 6000
KEYS = 40
EVERY = 100  # records per checkpoint
RATE = 800  # records/s of a worker that will be killed
# the suite's loop is short; STATELOG_LONG_LOOPS=1 runs the longer one (22 kills)
KILLS = 22 if os.environ.get("STATELOG_LONG_LOOPS") == "1" else 14
STANDBY_KILLS = 4  # writer kills with a hot standby in place

Record = tuple[int, int, str, int]  # partition, offset, key, value


class Worker:
    """``python -m tests.support.kafka.consumer_loop_worker``; its stdout lines arrive on a queue."""

    def __init__(self, broker: KafkaBroker, topic: str, root: str, *, finish: bool = False,
                 standby: bool = False) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH")) if p)
        args = [broker.bootstrap_servers, topic, root, str(EVERY), "0" if finish else str(RATE)]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.kafka.consumer_loop_worker",
                *args,
                *(["--finish"] if finish else []),
                *(["--standby"] if standby else []),
            ],
            cwd=PROJECT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.checkpoints: list[int] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("CHECKPOINT "):
                self.checkpoints.append(int(line.split()[1]))
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EOF")

    def expect(self, word: str, timeout: float = 60.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.split(" ", 1)[0] == word:
                return line.split(" ", 2)
            if line == "EOF":
                code = self.proc.wait()
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(
                    f"the worker exited (code {code}) before {word}:\n{err[-3000:]}"
                )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


@dataclass
class LoopStats:
    kills: int = 0
    kills_before_ready: int = 0
    kills_after_progress: int = 0  # the killed run had published a checkpoint
    restored_from: list[int] = field(default_factory=list)
    ready_s: list[float] = field(default_factory=list)  # spawn to READY


def produce(broker: KafkaBroker, topic: str, seed: int) -> list[Record]:
    from confluent_kafka import Producer

    rng = random.Random(seed)
    producer = Producer(broker.config(**{"enable.idempotence": True, "linger.ms": 5}))
    delivered: list[Record] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key().decode(), int(msg.value())))  # type: ignore[attr-defined]

    for _ in range(RECORDS):
        key = f"k{rng.randrange(KEYS)}"
        producer.produce(
            topic,
            key=key.encode(),
            value=str(rng.randrange(1000)).encode(),
            on_delivery=on_delivery,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(delivered) == RECORDS
    return delivered


def model(records: list[Record], offsets: dict[int, int]) -> dict[str, tuple[int, int]]:
    """(count, total) per key of the records before ``offsets`` (partition -> next offset)."""
    out: dict[str, tuple[int, int]] = {}
    for partition, offset, key, value in records:
        if offset < offsets.get(partition, 0):
            count, total = out.get(key, (0, 0))
            out[key] = (count + 1, total + value)
    return out


def state_at(
    job: statelog.StateJob, meta: statelog.CheckpointMetadata
) -> dict[str, tuple[int, int]]:
    backend = job.backend(OPERATOR, restore=meta, changelog=False)
    try:
        count, total = backend.get_state(COUNT), backend.get_state(TOTAL)
        out = {}
        for k in range(KEYS):
            backend.set_current_key(f"k{k}")
            if count.value():
                out[f"k{k}"] = (count.value(), total.value())
        return out
    finally:
        backend.close()


def run_loop(broker: KafkaBroker, topic: str, root: str, seed: int) -> LoopStats:
    rng = random.Random(seed)
    stats = LoopStats()
    while stats.kills < KILLS:
        worker = Worker(broker, topic, root)
        if stats.kills % 5 == 4:  # during start-up or restore, before READY
            time.sleep(rng.uniform(0.05, 1.0))
            if worker.proc.poll() is None:
                stats.kills_before_ready += worker.lines.empty()
                worker.kill()
                stats.kills += 1
            continue
        started = time.monotonic()
        ready = worker.expect("READY")
        stats.ready_s.append(round(time.monotonic() - started, 2))
        stats.restored_from.append(int(ready[1]))
        time.sleep(rng.uniform(0.0, 0.6))
        assert worker.proc.poll() is None, f"the worker died on its own: {worker.proc.returncode}"
        worker.kill()
        stats.kills += 1
        stats.kills_after_progress += bool(worker.checkpoints)
    final = Worker(broker, topic, root, finish=True)
    final.expect("DONE", timeout=120)
    assert final.proc.wait(30) == 0
    return stats


def check_checkpoints(root: str, topic: str, records: list[Record], ends: dict[int, int], at_least: int) -> None:
    """Every completed checkpoint's state is the fold of exactly the records before its offsets,
    which only grow, and the last one read everything."""
    t_check = time.monotonic()
    with statelog.open(root, writer_lease=False) as job:
        ids = job.catalog.checkpoint_ids()
        assert len(ids) >= at_least, ids
        previous: dict[int, int] = {}
        for cid in ids:
            meta = job.load_checkpoint(cid)
            offsets = meta.sources[topic]
            assert all(type(p) is int and type(o) is int for p, o in offsets.items()), offsets
            assert set(offsets) == set(range(PARTITIONS))
            assert all(offsets[p] >= previous.get(p, 0) for p in offsets), (cid, previous, offsets)
            assert state_at(job, meta) == model(records, offsets), f"checkpoint {cid} at {offsets}"
            previous = offsets
        assert previous == ends  # the last one read everything
    logger.info("%d checkpoints checked in %.1fs", len(ids), time.monotonic() - t_check)


@pytest.mark.slow
def test_consumer_loop_sigkill(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    records = produce(kafka_broker, topic, seed=1616)
    ends = {p: 1 + max(o for q, o, _, _ in records if q == p) for p in range(PARTITIONS)}
    root = (tmp_path / "root").as_uri()
    stats = run_loop(kafka_broker, topic, root, seed=20261125)
    logger.info("consumer loop: %s", stats)
    assert stats.kills == KILLS
    # every fifth kill lands before READY; nearly all others after the worker checkpointed
    assert stats.kills_after_progress >= KILLS // 2 - 1, stats
    check_checkpoints(root, topic, records, ends, at_least=40)
    assert max(stats.restored_from) > 0, stats


def test_consumer_loop_sigkill_with_a_hot_standby(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """The writer is SIGKILLed with a standby in place, a few times: each standby takes over from
    its replica (no restore) at the newest checkpoint and goes on; every checkpoint, those
    taken after each takeover included, holds exactly the records before its offsets."""
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    records = produce(kafka_broker, topic, seed=1717)
    ends = {p: 1 + max(o for q, o, _, _ in records if q == p) for p in range(PARTITIONS)}
    root = (tmp_path / "root").as_uri()
    rng = random.Random(20261128)
    writer = Worker(kafka_broker, topic, root)
    writer.expect("READY")
    took_over = []
    for _ in range(STANDBY_KILLS):
        standby = Worker(kafka_broker, topic, root, standby=True)
        standby.expect("STANDBY")
        time.sleep(rng.uniform(0.8, 1.5))  # the writer checkpoints, the standby follows
        assert standby.proc.poll() is None and writer.proc.poll() is None
        writer.kill()
        announced = max(writer.checkpoints, default=0)
        _, cid, replica = standby.expect("TOOK_OVER")
        assert replica == "1", "the standby restored instead of continuing from its replica"
        assert int(cid) >= announced  # the newest checkpoint, not an older one it had followed
        standby.expect("READY")
        took_over.append(int(cid))
        writer = standby
    writer.kill()
    final = Worker(kafka_broker, topic, root, finish=True)
    final.expect("DONE", timeout=120)
    assert final.proc.wait(30) == 0
    assert len(took_over) == STANDBY_KILLS and max(took_over) > 0, took_over
    check_checkpoints(root, topic, records, ends, at_least=STANDBY_KILLS)


def test_second_consumer_loop_on_the_root_is_refused(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    root = (tmp_path / "root").as_uri()
    first = Worker(kafka_broker, topic, root)
    try:
        first.expect("READY")
        second = Worker(kafka_broker, topic, root)
        refused = second.expect("REFUSED", timeout=60)
        assert second.proc.wait(30) == 3
        assert "writer lease" in refused[-1] and "kafka-loop" in refused[-1], refused
        assert first.proc.poll() is None  # the holder keeps running
    finally:
        first.kill()
