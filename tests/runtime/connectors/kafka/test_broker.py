"""Broker conformance: the Kafka semantics statelog's connectors rely on, pinned on the test
broker (noida-db, ``tests/support/kafka/broker.py``) with the ``confluent-kafka`` client.

What holds (each test names one):

* records of a partition come back in produce order at contiguous offsets (non-transactional
  topics); one key always lands in one partition; ``position()`` is the next offset to read;
* ``assign`` at an offset and ``seek`` start exactly there; ``OFFSET_BEGINNING``/``OFFSET_END``
  and the low/high watermarks behave as in Kafka;
* ``offsets_for_times`` gives the first offset whose timestamp is >= the time, ``OFFSET_END``
  (-1) past the last record; record timestamps come back as produced (create time);
* transactions: committed records are visible to ``read_committed`` readers, aborted ones are
  hidden from them (``read_uncommitted`` readers see them); commit/abort markers take an
  offset each, so offsets in a transactional topic have gaps;
* a ``read_committed`` reader stops at the last stable offset: nothing after an open
  transaction is delivered until it ends;
* zombie fencing: ``init_transactions`` of a second producer with the same
  ``transactional.id`` fences the first (its next send/commit fails with the fatal
  ``_FENCED``) and aborts its open transaction;
* a SIGKILLed producer's open transaction holds back ``read_committed`` readers until a new
  producer with the same ``transactional.id`` initialises; then it is aborted (hidden);
* ``send_offsets_to_transaction`` commits the group's offsets with the transaction, and an
  aborted transaction leaves them unchanged.

What does NOT hold (tests pin it so a change is noticed): the broker does not expire an open
transaction after ``transaction.timeout.ms``; recovery must never wait for that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support.kafka.broker import KafkaBroker

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

pytestmark = pytest.mark.kafka

Record = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


def _consumer(broker: KafkaBroker, isolation: str = "read_committed", **conf: Any) -> Any:
    return Consumer(
        broker.config(
            **{
                "group.id": conf.pop("group.id", "conformance"),
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "enable.partition.eof": True,
                **conf,
            }
        )
    )


def drain(
    broker: KafkaBroker,
    topic: str,
    partitions: int = 1,
    *,
    isolation: str = "read_committed",
    start: int = OFFSET_BEGINNING,
    timeout: float = 10.0,
) -> list[Record]:
    """Every record of ``topic`` a reader at ``isolation`` gets now (until end of each partition)."""
    consumer = _consumer(broker, isolation)
    try:
        consumer.assign([TopicPartition(topic, p, start) for p in range(partitions)])
        out: list[Record] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: no end of partitions within {timeout}s"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def _values(records: list[Record]) -> list[bytes | None]:
    return [r[3] for r in records]


def _txn_producer(broker: KafkaBroker, txn_id: str, **conf: Any) -> Any:
    producer = Producer(broker.config(**{"transactional.id": txn_id, **conf}))
    producer.init_transactions(10)
    return producer


def test_partition_order_and_contiguous_offsets(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=3)
    producer = Producer(kafka_broker.config(**{"enable.idempotence": True}))
    for i in range(600):
        producer.produce(topic, value=str(i).encode(), key=f"k{i % 7}".encode(), partition=i % 3)
    assert producer.flush(10) == 0
    records = drain(kafka_broker, topic, 3)
    assert len(records) == 600
    for p in range(3):
        mine = [r for r in records if r[0] == p]
        assert [r[1] for r in mine] == list(range(200))
        assert _values(mine) == [str(i).encode() for i in range(p, 600, 3)]
    # without an explicit partition one key always lands in one partition
    keyed = kafka_broker.create_topic(partitions=4)
    for i in range(200):
        producer.produce(keyed, value=str(i).encode(), key=f"user{i % 10}".encode())
    assert producer.flush(10) == 0
    where: dict[bytes | None, set[int]] = {}
    per_key: dict[bytes | None, list[bytes | None]] = {}
    for p, _, key, value in sorted(drain(kafka_broker, keyed, 4), key=lambda r: (r[0], r[1])):
        where.setdefault(key, set()).add(p)
        per_key.setdefault(key, []).append(value)
    assert all(len(ps) == 1 for ps in where.values()), where
    for k in range(10):  # and a key's records stay in produce order
        assert per_key[f"user{k}".encode()] == [str(i).encode() for i in range(k, 200, 10)]


def test_assign_at_offset_seek_position_and_watermarks(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    producer = Producer(kafka_broker.config())
    for i in range(20):
        producer.produce(topic, value=str(i).encode(), partition=0)
    assert producer.flush(10) == 0
    consumer = _consumer(kafka_broker)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 20)
        assert consumer.get_watermark_offsets(TopicPartition(topic, 1), timeout=5) == (0, 0)
        consumer.assign([TopicPartition(topic, 0, 10)])
        msg = consumer.poll(5)
        assert msg is not None and (msg.offset(), msg.value()) == (10, b"10")
        (pos,) = consumer.position([TopicPartition(topic, 0)])
        assert pos.offset == 11  # the next offset to read: what a checkpoint records
        consumer.seek(TopicPartition(topic, 0, 3))
        msg = consumer.poll(5)
        assert msg is not None and (msg.offset(), msg.value()) == (3, b"3")
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        msg = consumer.poll(5)
        assert msg is not None and msg.offset() == 0
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        msg = consumer.poll(5)
        assert msg is not None and msg.error() and msg.error().code() == KafkaError._PARTITION_EOF
        producer.produce(topic, value=b"20", partition=0)
        producer.flush(10)
        msg = consumer.poll(5)
        assert msg is not None and not msg.error() and (msg.offset(), msg.value()) == (20, b"20")
    finally:
        consumer.close()


def test_offsets_for_times_and_record_timestamps(kafka_broker: KafkaBroker) -> None:
    # made-up timestamps: without retention.ms=-1 the broker deletes records older than 7 days
    topic = kafka_broker.create_topic(partitions=2, config={"retention.ms": "-1"})
    producer = Producer(kafka_broker.config())
    for p in range(2):
        for i, ts in enumerate((1000, 2000, 2000, 3000)):
            producer.produce(topic, value=f"{p}-{i}".encode(), partition=p, timestamp=ts + p)
    assert producer.flush(10) == 0
    consumer = _consumer(kafka_broker)
    try:

        def lookup(ts: int) -> list[int]:
            tps = [TopicPartition(topic, p, ts) for p in range(2)]
            return [tp.offset for tp in consumer.offsets_for_times(tps, timeout=5)]

        assert lookup(0) == [0, 0]
        assert lookup(1000) == [0, 0]  # partition 1: its first record (1001) is the first >= 1000
        assert lookup(1500) == [1, 1]
        assert lookup(2001) == [3, 1]  # the first of equal timestamps
        assert lookup(3000) == [3, 3]
        assert lookup(3002) == [OFFSET_END, OFFSET_END]  # past the last record: -1
        consumer.assign([TopicPartition(topic, 1, 1)])
        msg = consumer.poll(5)
        assert msg is not None and msg.timestamp() == (TIMESTAMP_CREATE_TIME, 2001)
    finally:
        consumer.close()


def test_commit_visible_abort_hidden_from_read_committed(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    producer = _txn_producer(kafka_broker, f"{topic}-tx")
    for value, commit in ((b"c1", True), (b"a1", False), (b"c2", True)):
        producer.begin_transaction()
        producer.produce(topic, value=value)
        producer.flush(10)
        if commit:
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)
    committed = drain(kafka_broker, topic)
    assert _values(committed) == [b"c1", b"c2"]
    # each transaction's end marker takes an offset: c1 at 0, marker, a1 at 2, marker, c2 at 4
    assert [r[1] for r in committed] == [0, 4]
    assert _values(drain(kafka_broker, topic, isolation="read_uncommitted")) == [
        b"c1",
        b"a1",
        b"c2",
    ]
    consumer = _consumer(kafka_broker)
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 6)
    finally:
        consumer.close()


def test_read_committed_stops_at_an_open_transaction(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    txn = _txn_producer(kafka_broker, f"{topic}-tx")
    plain = Producer(kafka_broker.config())
    plain.produce(topic, value=b"before")
    plain.flush(10)
    txn.begin_transaction()
    txn.produce(topic, value=b"in-txn")
    txn.flush(10)
    plain.produce(topic, value=b"after")
    plain.flush(10)
    assert _values(drain(kafka_broker, topic)) == [b"before"]  # held at the last stable offset
    txn.commit_transaction(10)
    assert _values(drain(kafka_broker, topic)) == [b"before", b"in-txn", b"after"]


def test_zombie_producer_is_fenced(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    txn_id = f"{topic}-tx"
    zombie = _txn_producer(kafka_broker, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-1")
    zombie.flush(10)
    successor = _txn_producer(kafka_broker, txn_id)  # fences the zombie, aborts its transaction
    with pytest.raises(KafkaException) as err:
        zombie.produce(topic, value=b"zombie-2")
        zombie.flush(5)
        zombie.commit_transaction(10)
    error = err.value.args[0]
    assert error.code() == KafkaError._FENCED and error.fatal(), error
    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(10)
    assert _values(drain(kafka_broker, topic)) == [b"successor"]


_KILLED_PRODUCER = """
import os, signal, sys
from confluent_kafka import Producer
servers, txn_id, topic = sys.argv[1:4]
p = Producer({"bootstrap.servers": servers, "transactional.id": txn_id})
p.init_transactions(10)
p.begin_transaction()
for i in range(5):
    p.produce(topic, value=b"killed-%d" % i)
assert p.flush(10) == 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_producers_transaction_is_aborted_when_its_id_is_reinitialised(
    kafka_broker: KafkaBroker,
) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    txn_id = f"{topic}-tx"
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_PRODUCER, kafka_broker.bootstrap_servers, txn_id, topic],
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == -9, done.stderr.decode(errors="replace")[-2000:]
    plain = Producer(kafka_broker.config())
    plain.produce(topic, value=b"after-kill")
    plain.flush(10)
    assert _values(drain(kafka_broker, topic, isolation="read_uncommitted"))[-1] == b"after-kill"
    assert drain(kafka_broker, topic) == []  # the open transaction holds readers back
    successor = _txn_producer(kafka_broker, txn_id)  # aborts the dead producer's transaction
    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(10)
    assert _values(drain(kafka_broker, topic)) == [b"after-kill", b"successor"]


def test_send_offsets_to_transaction(kafka_broker: KafkaBroker) -> None:
    source = kafka_broker.create_topic(partitions=1)
    sink = kafka_broker.create_topic(partitions=1)
    group = f"{source}-group"
    consumer = _consumer(kafka_broker, **{"group.id": group})
    producer = _txn_producer(kafka_broker, f"{sink}-tx")
    try:
        tp = TopicPartition(source, 0)
        for offset, commit in ((3, True), (5, False)):
            producer.begin_transaction()
            producer.produce(sink, value=str(offset).encode())
            producer.send_offsets_to_transaction(
                [TopicPartition(source, 0, offset)], consumer.consumer_group_metadata(), 10
            )
            if commit:
                producer.commit_transaction(10)
            else:
                producer.abort_transaction(10)
            (committed,) = consumer.committed([tp], timeout=10)
            assert committed.offset == 3
        assert _values(drain(kafka_broker, sink)) == [b"3"]
    finally:
        consumer.close()


def test_open_transactions_do_not_expire(kafka_broker: KafkaBroker) -> None:
    """A gap, pinned: ``transaction.timeout.ms`` is not enforced; a transaction left open past
    it still commits. Recovery must fence (re-initialise the id), never wait for a timeout."""
    topic = kafka_broker.create_topic(partitions=1)
    producer = _txn_producer(kafka_broker, f"{topic}-tx", **{"transaction.timeout.ms": 1000})
    producer.begin_transaction()
    producer.produce(topic, value=b"late")
    producer.flush(10)
    time.sleep(2.5)
    producer.commit_transaction(10)
    assert _values(drain(kafka_broker, topic)) == [b"late"]
