"""statelog.kafka.KafkaOffsets against the test broker: restore (assign + seek) from a
checkpoint or a fresh start, the positions recorded in ``job.checkpoint``, typed sources,
pre-v3 checkpoints with string partitions, and bad input refused with clear errors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError
from statelog.kafka import KafkaOffsets, checkpoint_positions
from tests.support.kafka.broker import KafkaBroker

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402

pytestmark = pytest.mark.kafka
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def _consumer(broker: KafkaBroker) -> Any:
    return Consumer(broker.config(**{"group.id": "offsets-test", "enable.auto.commit": False}))


def _fill(broker: KafkaBroker, topic: str, per_partition: int, partitions: int, **kw: Any) -> None:
    producer = Producer(broker.config())
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(
                topic, key=f"k{i % 3}".encode(), value=f"{p}:{i}".encode(), partition=p, **kw
            )
    assert producer.flush(10) == 0


def _read(consumer: Any, n: int, timeout: float = 10.0) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"read {len(out)} of {n} records"
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append((msg.partition(), msg.offset()))
    return out


def _meta(sources: dict[str, Any]) -> CheckpointMetadata:
    return CheckpointMetadata(7, "job", 0, 128, sources, {})


def test_restore_checkpoint_and_record_positions(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    _fill(kafka_broker, topic, 10, 2)
    root = (tmp_path / "root").as_uri()
    with statelog.open(root) as job:
        backend = job.backend("counter", restore="none")
        consumer = _consumer(kafka_broker)
        try:
            offsets = KafkaOffsets(consumer, [topic])
            assert offsets.restore(None) == {topic: {0: 0, 1: 0}}  # earliest
            assert offsets.positions() == {topic: {0: 0, 1: 0}}  # nothing read yet
            for partition, _ in _read(consumer, 7):
                backend.set_current_key(partition)
                backend.get_state(COUNT).update(backend.get_state(COUNT).value() + 1)
            positions = offsets.positions()
            assert sum(positions[topic].values()) == 7
            meta = offsets.checkpoint(job, {"other": {"x": 1}}, commit_offsets=True)
        finally:
            consumer.close()
    assert meta.sources == {topic: positions[topic], "other": {"x": 1}}
    with statelog.open(root) as job:
        last = job.latest_checkpoint()
        assert last is not None
        assert last.sources[topic] == positions[topic]
        assert all(type(p) is int for p in last.sources[topic])  # typed, not "0"/"1"
        consumer = _consumer(kafka_broker)
        try:
            offsets = KafkaOffsets(consumer, topic)
            assert offsets.restore(last) == positions
            rest = _read(consumer, 13)
            assert sorted(rest) == sorted(
                (p, o) for p in range(2) for o in range(positions[topic][p], 10)
            )  # exactly the records after the checkpoint
            assert offsets.positions() == {topic: {0: 10, 1: 10}}
            (committed0, committed1) = consumer.committed(
                [ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 1)], timeout=10
            )
            assert {0: committed0.offset, 1: committed1.offset} == positions[
                topic
            ]  # monitoring copy
        finally:
            consumer.close()


def test_fresh_start_latest_timestamp_and_owned_partitions(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=3, config={"retention.ms": "-1"})
    producer = Producer(kafka_broker.config())
    for p in range(3):
        for i, ts in enumerate((1000, 2000, 3000)):
            producer.produce(topic, value=b"x", partition=p, timestamp=ts + i)
    assert producer.flush(10) == 0
    consumer = _consumer(kafka_broker)
    try:
        assert KafkaOffsets(consumer, topic, start="latest").restore(None) == {
            topic: {0: 3, 1: 3, 2: 3}
        }
        assert KafkaOffsets(consumer, topic, start=2000).restore(None) == {
            topic: {0: 1, 1: 1, 2: 1}
        }
        assert KafkaOffsets(consumer, topic, start=10**12).restore(None) == {
            topic: {0: 3, 1: 3, 2: 3}
        }
        # this process owns partitions 0 and 2; the checkpoint names 1 too (another process's)
        owned = KafkaOffsets(consumer, topic, partitions={topic: [2, 0]})
        start = owned.restore(_meta({topic: {0: 2, 1: 1}}))
        assert start == {topic: {0: 2, 2: 0}}
        assert {tp.partition for tp in consumer.assignment()} == {0, 2}
        got = _read(consumer, 4)
        assert sorted(got) == [(0, 2), (2, 0), (2, 1), (2, 2)]
    finally:
        consumer.close()


def test_pre_v3_checkpoints_with_string_partitions_still_restore(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    _fill(kafka_broker, topic, 4, 2)
    # checkpoints written before format version 3 stored partitions as JSON object keys
    old = _meta({topic: {"0": 3, "1": 1}})
    assert checkpoint_positions(old, topic) == {topic: {0: 3, 1: 1}}
    consumer = _consumer(kafka_broker)
    try:
        offsets = KafkaOffsets(consumer, topic)
        assert offsets.restore(old) == {topic: {0: 3, 1: 1}}
        assert sorted(_read(consumer, 4)) == [(0, 3), (1, 1), (1, 2), (1, 3)]
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topics": []}, "non-empty list"),
        ({"topics": ["a", "a"]}, "twice"),
        ({"start": "beginning"}, "'earliest', 'latest'"),
        ({"start": -5}, "timestamp in milliseconds"),
        ({"partitions": {"nope": [0]}}, "not in topics"),
        ({"partitions": {"T": []}}, "is empty"),
        ({"partitions": {"T": [-1]}}, "not a partition number"),
    ],
)
def test_bad_arguments_are_refused(
    kafka_broker: KafkaBroker, kwargs: dict[str, Any], message: str
) -> None:
    kwargs = {"topics": ["T"], **kwargs}
    with pytest.raises(ConfigError, match=message):
        KafkaOffsets(object(), **kwargs)


def test_bad_checkpoints_and_topics_are_refused(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    consumer = _consumer(kafka_broker)
    try:
        offsets = KafkaOffsets(consumer, topic)
        with pytest.raises(ConfigError, match="before restore"):
            offsets.positions()
        with pytest.raises(ConfigError, match="expected Kafka offsets"):
            offsets.restore(_meta({topic: 17}))
        with pytest.raises(ConfigError, match="expected an offset"):
            offsets.restore(_meta({topic: {0: "5"}}))
        with pytest.raises(ConfigError, match=r"partitions \[5\].*has only partitions \[0, 1\]"):
            offsets.restore(_meta({topic: {0: 1, 5: 1}}))
        with pytest.raises(
            ConfigError, match=r"offset 100 for .*\[1\], but the partition ends at offset 0"
        ):
            offsets.restore(_meta({topic: {0: 0, 1: 100}}))
        with pytest.raises(ConfigError, match=r"partitions \[4\] of topic .* do not exist"):
            KafkaOffsets(consumer, topic, partitions={topic: [0, 4]}).restore(None)
        with pytest.raises(ConfigError, match="'no-such-topic' cannot be read.*does it exist"):
            KafkaOffsets(consumer, "no-such-topic", timeout_s=5).restore(None)
        offsets.restore(None)
        with pytest.raises(ConfigError, match="has the name of a Kafka topic"):
            offsets.sources({topic: 1})
    finally:
        consumer.close()


def test_records_deleted_before_the_checkpoints_offset_are_reported(
    kafka_broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    _fill(kafka_broker, topic, 3, 1, timestamp=1000)  # older than the 7-day retention
    consumer = _consumer(kafka_broker)
    try:
        deadline = time.monotonic() + 20
        while (
            consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=5, cached=False)[0]
            < 3
        ):
            assert time.monotonic() < deadline, "the broker did not apply retention"
            time.sleep(0.2)
        with caplog.at_level("WARNING", logger="statelog.kafka"):
            assert KafkaOffsets(consumer, topic).restore(_meta({topic: {0: 1}})) == {topic: {0: 1}}
        assert "records 1..2 were deleted (retention)" in caplog.text
    finally:
        consumer.close()


def test_checkpoint_reports_each_partitions_lag_to_the_job_metrics(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    _fill(kafka_broker, topic, 10, 2)
    with statelog.open((tmp_path / "root").as_uri()) as job:
        job.backend("counter", restore="none")
        consumer = _consumer(kafka_broker)
        try:
            offsets = KafkaOffsets(consumer, [topic])
            offsets.restore(None)
            _read(consumer, 7)
            positions = offsets.positions()[topic]
            offsets.checkpoint(job)
        finally:
            consumer.close()
        # the high watermark (10) the consumer fetched, minus each partition's position
        fetched = {p: 10 - positions[p] for p in positions if positions[p] > 0}
        assert fetched and {p: job.metrics.lag[(topic, p)] for p in fetched} == fetched
        assert set(job.metrics.lag) <= {(topic, 0), (topic, 1)}
