"""The runtime's KafkaSource and KafkaSink without failures: the golden output, offsets in
the checkpoints, starting offsets, watermarks from record timestamps, bad input."""

from __future__ import annotations

import json
import time
import uuid

import pyarrow as pa
import pytest

import statelog
from runtime import CollectSink, JobGraphError, StreamExecutionEnvironment
from runtime.api.batches import aggregate_descriptor
from runtime.connectors.kafka import RECORD_TIMESTAMP, KafkaRecord, KafkaSink, KafkaSource
from runtime.connectors.kafka.records import split_id
from runtime.connectors.sources import WatermarkStrategy
from tests.support import jobs
from tests.support.kafka.jobs import build_kafka_clicks, clicks_env, produce_clicks, read_topic
from tests.support.s3server import RootSpec

pytestmark = pytest.mark.kafka


def test_kafka_in_kafka_out_golden(kafka_broker, file_root: RootSpec) -> None:
    tin = kafka_broker.create_topic(partitions=jobs.CLICK_SPLITS)
    tout = kafka_broker.create_topic(partitions=2)
    produce_clicks(kafka_broker, tin, 600)
    env = clicks_env(file_root.url)
    build_kafka_clicks(env, kafka_broker.bootstrap_servers, tin, tout, prefix=f"g-{uuid.uuid4().hex[:6]}")
    result = env.execute("kafka-golden", timeout_s=120)
    assert result.attempts == 1 and result.final_checkpoint is not None
    assert sorted(read_topic(kafka_broker, tout)) == jobs.golden_windows(600)
    with statelog.open(file_root.url) as job:
        final = job.load_checkpoint(result.final_checkpoint)
    assert set(final.sources["clicks"]) == {split_id(tin, k) for k in range(jobs.CLICK_SPLITS)}
    assert all(p["offset"] == 600 and p["stop"] == 600 for p in final.sources["clicks"].values())


# -- the source's reading side, without a job ----------------------------------------------------


def _produce(broker, topic: str, values: list, partition: int = 0, timestamp: int | None = None) -> None:
    from confluent_kafka import Producer

    p = Producer(broker.config())
    for v in values:
        kw = {"timestamp": timestamp} if timestamp is not None else {}
        p.produce(topic, json.dumps(v).encode(), key=str(v).encode(), partition=partition, **kw)
    assert p.flush(10) == 0


def _drain(splits, rounds: int = 200) -> list:
    out = []
    empty = 0
    for _ in range(rounds):
        got = splits.read(100)
        out += got
        empty = 0 if got else empty + 1
        if splits.finished or empty > 30:
            break
    return out


def _source(broker, topic, **kw) -> KafkaSource:
    kw.setdefault("value_deserializer", json.loads)
    kw.setdefault("discovery_interval_s", None)
    return KafkaSource(broker.bootstrap_servers, topic, **kw)


def test_restore_seeks_to_the_checkpointed_offsets_not_the_group(kafka_broker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    _produce(kafka_broker, topic, list(range(10)), 0)
    _produce(kafka_broker, topic, list(range(100, 105)), 1)
    src = _source(kafka_broker, topic, bounded=True, commit_offsets=True, group_id="g-restore")
    first = src.open_splits({s: None for s in src.splits()}, None)
    got = [v for v, _ in first.read(3)]
    pos = first.snapshot_positions(1)
    first.checkpoint_complete(1)  # commits the group's offsets: monitoring only
    rest = [v for v, _ in _drain(first)]
    first.close()
    assert sorted(got + rest) == list(range(10)) + list(range(100, 105))
    again = src.open_splits(pos, None, restored=True)
    replay = [v for v, _ in _drain(again)]
    again.close()
    assert sorted(got + replay) == list(range(10)) + list(range(100, 105))
    assert again.positions()[split_id(topic, 0)]["offset"] == 10


def test_starting_offsets_latest_timestamp_committed(kafka_broker) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka_broker.create_topic(partitions=1)
    now = int(time.time() * 1000)
    _produce(kafka_broker, topic, [0, 1, 2], timestamp=now - 60_000)
    _produce(kafka_broker, topic, [3, 4], timestamp=now - 1_000)
    split = split_id(topic, 0)

    def first_offset(**kw) -> int:
        s = _source(kafka_broker, topic, **kw).open_splits({split: None}, None)
        try:
            return s.positions()[split]["offset"]
        finally:
            s.close()

    assert first_offset() == 0
    assert first_offset(starting_offsets="latest") == 5
    assert first_offset(starting_offsets=now - 30_000) == 3
    assert first_offset(starting_offsets=now + 60_000) == 5  # nothing after it: the end
    c = Consumer(kafka_broker.config(**{"group.id": "g-committed"}))
    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    c.close()
    assert first_offset(starting_offsets="committed", group_id="g-committed") == 2
    assert first_offset(starting_offsets="committed", group_id="g-none") == 0
    # a restored job: a partition its checkpoint does not have starts at the earliest offset
    s = _source(kafka_broker, topic, starting_offsets="latest").open_splits({split: None}, None, restored=True)
    assert s.positions()[split]["offset"] == 0
    s.close()


def test_record_timestamps_per_partition_watermarks_and_idleness(kafka_broker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    now = int(time.time() * 1000)
    _produce(kafka_broker, topic, [1, 2], 0, timestamp=now)
    _produce(kafka_broker, topic, [3], 1, timestamp=now - 5_000)
    src = _source(kafka_broker, topic, idle_timeout_ms=300, emit="record")
    s = src.open_splits({split_id(topic, 0): None, split_id(topic, 1): None},
                        WatermarkStrategy(RECORD_TIMESTAMP, 100))  # fmt: skip
    got = _drain(s, rounds=40)
    assert sorted(r.value for r, _ in got) == [1, 2, 3]
    assert all(isinstance(r, KafkaRecord) and ts == r.timestamp for r, ts in got)
    assert {r.key for r, _ in got} == {b"1", b"2", b"3"}
    # both partitions active: the minimum; then idle: the newest partition's watermark
    time.sleep(0.4)
    assert s.watermark() == now - 101
    s.parts[(topic, 1)].last_seen = time.monotonic()  # partition 1 active again, partition 0 idle
    assert s.watermark() == now - 5_000 - 101
    s.close()


def test_partition_discovery_reads_new_partitions(kafka_broker) -> None:
    from confluent_kafka.admin import NewPartitions

    topic = kafka_broker.create_topic(partitions=1)
    _produce(kafka_broker, topic, [1])
    src = _source(kafka_broker, topic, discovery_interval_s=0.2)
    s = src.open_splits({split_id(topic, 0): None}, None)
    assert [v for v, _ in _drain(s, rounds=40)] == [1]
    admin = kafka_broker.admin()
    for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
        f.result(10)
    time.sleep(1.0)
    _produce(kafka_broker, topic, [2], 1)
    _produce(kafka_broker, topic, [3], 2)
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 2 and time.monotonic() < deadline:
        got += [v for v, _ in s.read(100)]
        time.sleep(0.05)
    assert sorted(got) == [2, 3]
    assert set(s.positions()) == {split_id(topic, n) for n in range(3)}
    s.close()


def test_bad_arguments_fail_clearly(kafka_broker) -> None:
    with pytest.raises(JobGraphError, match="exactly one of topics"):
        KafkaSource("b:9092")
    with pytest.raises(JobGraphError, match="starting_offsets"):
        KafkaSource("b:9092", "t", starting_offsets="middle")
    with pytest.raises(JobGraphError, match="pattern"):
        KafkaSource("b:9092", pattern="(")
    with pytest.raises(JobGraphError, match="transactional_id_prefix"):
        KafkaSink("b:9092", "t")
    with pytest.raises(JobGraphError, match="delivery"):
        KafkaSink("b:9092", "t", delivery="twice")
    with pytest.raises(Exception, match="does not exist"):
        KafkaSource(kafka_broker.bootstrap_servers, f"missing-{uuid.uuid4().hex[:6]}").splits()
    env = StreamExecutionEnvironment(state_root="file:///tmp/unused")
    with pytest.raises(JobGraphError):
        env.from_source(CollectSink(), uid="x")  # type: ignore[arg-type]


def test_secrets_are_redacted() -> None:
    from runtime.connectors.kafka.client import redact

    conf = {"sasl.password": "hunter2", "ssl.key.password": "k", "bootstrap.servers": "b:9092"}
    assert redact(conf) == {"sasl.password": "***", "ssl.key.password": "***", "bootstrap.servers": "b:9092"}


def test_sink_delivery_none(kafka_broker, file_root: RootSpec) -> None:
    tin = kafka_broker.create_topic(partitions=jobs.CLICK_SPLITS)
    tout = kafka_broker.create_topic(partitions=1)
    produce_clicks(kafka_broker, tin, 200)
    env = clicks_env(file_root.url)
    build_kafka_clicks(env, kafka_broker.bootstrap_servers, tin, tout, delivery="none")
    env.execute("kafka-none", timeout_s=120)
    assert sorted(read_topic(kafka_broker, tout)) == jobs.golden_windows(200)


def test_a_kafka_source_read_as_batches_feeds_a_keyed_batch_aggregate(kafka_broker, file_root: RootSpec) -> None:
    """from_source(KafkaSource(...), batches=True): each read's records (JSON dicts here) as
    one Arrow batch; key_by("k") and aggregate count them per key exactly once."""
    topic = kafka_broker.create_topic(partitions=2)
    rows = [{"k": i % 7, "v": i} for i in range(300)]
    _produce(kafka_broker, topic, rows[:150], 0)
    _produce(kafka_broker, topic, rows[150:], 1)
    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=0.2, state_root=file_root.url)
    src = _source(kafka_broker, topic, bounded=True)
    keyed = env.from_source(src, uid="events", batches=True, batch_rows=40).key_by("k")
    keyed.aggregate("sum", uid="sums", column="v", emit=False).sink_to(CollectSink(), uid="none")
    keyed.process_batches(_rows_of, uid="rows").sink_to(CollectSink(), uid="out")
    result = env.execute("kafka-batches", timeout_s=120)
    assert sorted(r["v"] for r in result.collected["out"]) == list(range(300))
    sums: dict[int, int] = {}
    with statelog.open(file_root.url) as job:
        for i in range(2):
            b = job.backend("sums", subtask=i, parallelism=2, restore=result.final_checkpoint, changelog=False)
            b.get_state(aggregate_descriptor("sum", "sum", pa.int64()))
            sums.update((k, v) for k, _ns, v in b.entries("sum"))
            b.close()
    assert sums == {k: sum(r["v"] for r in rows if r["k"] == k) for k in range(7)}


def _rows_of(batch: pa.RecordBatch, ctx: object) -> pa.RecordBatch:
    return batch.select(["k", "v"])
