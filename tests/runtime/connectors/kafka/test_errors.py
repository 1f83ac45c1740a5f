"""Kafka errors say where and what to do: a record the source cannot read names its topic,
partition and offset (or goes to a dead-letter topic, exactly once with the checkpoints); a
sink with a wrong bootstrap address fails as the source does; KafkaOffsets' connection
errors are ConfigErrors naming the address; a fatal producer error after a broker restart is
reported as itself, not as a SystemError from the delivery callback."""

from __future__ import annotations

import gc
import json
import re
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime import (
    CollectSink,
    JobFailedError,
    NoRestart,
    StreamExecutionEnvironment,
    WatermarkStrategy,
)
from runtime.connectors.kafka import (
    DLQ_ERROR,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TOPIC,
    DeadLetter,
    KafkaError,
    KafkaSink,
    KafkaSource,
)
from runtime.connectors.kafka.records import split_id
from statelog.errors import ConfigError
from statelog.kafka import KafkaOffsets
from tests.support.kafka.broker import KafkaBroker, client_handles, start_kafka
from tests.support.procs import free_ports
from tests.support.s3server import RootSpec

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

pytestmark = pytest.mark.kafka

# offset 2 is no JSON, offset 4 lacks the field "v"
RECORDS = [b'{"v": 0}', b'{"v": 1}', b"not json", b'{"v": 3}', b'{"w": 4}', b'{"v": 5}']


def _v(raw: bytes) -> int:
    """The value deserializer of the tests: JSON with a field ``v``."""
    return json.loads(raw)["v"]


def _produce(broker: KafkaBroker, topic: str, values: list[bytes], partition: int = 0) -> None:
    p = Producer(broker.config())
    for i, v in enumerate(values):
        p.produce(topic, v, key=f"k{i}".encode(), partition=partition, headers=[("trace", b"t%d" % i)])
    assert p.flush(10) == 0


def _read_raw(broker: KafkaBroker, topic: str) -> list[tuple[bytes, bytes, dict[str, bytes]]]:
    """(key, value, headers) of every committed record of partition 0 of ``topic``."""
    c = Consumer(broker.config(**{"group.id": "dlq-reader", "enable.partition.eof": True,
                                  "isolation.level": "read_committed"}))  # fmt: skip
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    return out
                raise RuntimeError(str(m.error()))
            out.append((m.key(), m.value(), dict(m.headers() or ())))
        raise AssertionError(f"did not reach the end of {topic}")
    finally:
        c.close()


def _drain(splits: Any) -> list[Any]:
    out: list[Any] = []
    empty = 0
    while not splits.finished and empty < 50:
        got = splits.read(100)
        out += [v for v, _ in got]
        empty = 0 if got else empty + 1
    assert splits.finished
    return out


def _env(root: RootSpec, parallelism: int = 1) -> StreamExecutionEnvironment:
    return StreamExecutionEnvironment(parallelism=parallelism, state_root=root.url, restart_strategy=NoRestart(),
                                      checkpoint_interval_s=0.2)  # fmt: skip


# -- a record the source cannot read --------------------------------------------------------------


def test_an_unreadable_record_fails_the_job_naming_topic_partition_and_offset(
    kafka_broker: KafkaBroker, file_root: RootSpec
) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    _produce(kafka_broker, topic, RECORDS[:2], partition=0)
    _produce(kafka_broker, topic, RECORDS[:3], partition=1)
    env = _env(file_root)
    env.from_source(KafkaSource(kafka_broker.bootstrap_servers, topic, bounded=True, value_deserializer=json.loads,
                                discovery_interval_s=None), uid="in").sink_to(CollectSink(), uid="out")  # fmt: skip
    with pytest.raises(JobFailedError) as info:
        env.execute("bad-record", timeout_s=60)
    msg = str(info.value)
    assert f"could not read the record at topic {topic!r}, partition 1, offset 2: the value_deserializer " \
           "raised JSONDecodeError: Expecting value" in msg  # fmt: skip
    assert "on_error=DeadLetter(" in msg


def test_a_record_without_a_field_names_where_it_is(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    _produce(kafka_broker, topic, [b'{"v": 0}', b'{"w": 1}'])
    src = KafkaSource(kafka_broker.bootstrap_servers, topic, bounded=True, value_deserializer=_v,
                      discovery_interval_s=None)  # fmt: skip
    splits = src.open_splits({split_id(topic, 0): None}, None)
    try:
        with pytest.raises(KafkaError, match=rf"topic '{topic}', partition 0, offset 1: the value_deserializer "
                                             r"raised KeyError: 'v'"):  # fmt: skip
            _drain(splits)
    finally:
        splits.close()


def test_dead_letters_are_written_exactly_once_across_failures_and_restores(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    dlq = kafka_broker.create_topic(partitions=1)
    _produce(kafka_broker, topic, RECORDS)
    src = KafkaSource(kafka_broker.bootstrap_servers, topic, bounded=True, value_deserializer=_v,
                      discovery_interval_s=None,
                      on_error=DeadLetter(dlq, transactional_id_prefix=f"dl-{uuid.uuid4().hex[:6]}"))  # fmt: skip
    fresh = {split_id(topic, 0): None}

    # attempt 1 reads everything and dies before its next checkpoint: its dead letters are not committed
    a1 = src.open_splits(fresh, None)
    assert _drain(a1) == [0, 1, 3, 5]
    assert a1.dead_letters is not None
    assert a1.dead_letters.producer.flush(10) == 0
    assert _read_raw(kafka_broker, dlq) == []
    # attempt 2 of the same subtask fences attempt 1 (aborting its transaction), reads again and
    # checkpoints: the dead letters are committed with the positions, before the checkpoint is acknowledged
    a2 = src.open_splits(fresh, None)
    start = a2.positions()
    assert _drain(a2) == [0, 1, 3, 5]
    a2.snapshot_positions(1)
    got = _read_raw(kafka_broker, dlq)
    assert [(k, v) for k, v, _ in got] == [(b"k2", b"not json"), (b"k4", b'{"w": 4}')]
    h2, h4 = got[0][2], got[1][2]
    assert (h2[DLQ_TOPIC], h2[DLQ_PARTITION], h2[DLQ_OFFSET]) == (topic.encode(), b"0", b"2")
    assert h2["trace"] == b"t2"  # the record's own headers are kept
    assert h2[DLQ_ERROR].startswith(b"value_deserializer: JSONDecodeError: Expecting value")
    assert h4[DLQ_OFFSET] == b"4" and h4[DLQ_ERROR] == b"value_deserializer: KeyError: 'v'"
    with pytest.raises(ck.KafkaException):  # attempt 1 is a fenced zombie
        a1.dead_letters.producer.commit_transaction(10)
    a1.close()
    a2.close()

    # checkpoint 1 did not complete: attempt 3 restores the one before (the start) and reads the
    # records again; those dead-lettered before are not produced again
    a3 = src.open_splits(start, None, restored=True)
    assert _drain(a3) == [0, 1, 3, 5]
    a3.snapshot_positions(2)
    a3.close()
    assert [v for _, v, _ in _read_raw(kafka_broker, dlq)] == [b"not json", b'{"w": 4}']


def test_a_job_sends_unreadable_records_to_the_dead_letter_topic(kafka_broker: KafkaBroker, file_root: RootSpec) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    dlq = kafka_broker.create_topic(partitions=1)
    now = int(time.time() * 1000)
    _produce(kafka_broker, topic, [json.dumps({"v": i, "ts": now + i}).encode() for i in range(3)] + [b"{"], 0)
    _produce(kafka_broker, topic, [b'{"v": 10}', json.dumps({"v": 11, "ts": now}).encode()], 1)
    env = _env(file_root, parallelism=2)
    source = KafkaSource(kafka_broker.bootstrap_servers, topic, bounded=True, value_deserializer=json.loads,
                         discovery_interval_s=None,
                         on_error=DeadLetter(dlq, transactional_id_prefix=f"dl-{uuid.uuid4().hex[:6]}"))  # fmt: skip
    # the watermarks' timestamp function reads a field: a record without it is dead-lettered too
    (env.from_source(source, uid="in", watermarks=WatermarkStrategy(lambda e: e["ts"], 0))
        .map(lambda e: e["v"]).sink_to(CollectSink(), uid="out"))  # fmt: skip
    result = env.execute("dead-letters", timeout_s=60)
    assert sorted(result.collected["out"]) == [0, 1, 2, 11]
    got = sorted(_read_raw(kafka_broker, dlq), key=lambda r: r[2][DLQ_PARTITION])
    assert [(v, h[DLQ_PARTITION], h[DLQ_OFFSET]) for _, v, h in got] == [(b"{", b"0", b"3"), (b'{"v": 10}', b"1", b"0")]
    assert got[1][2][DLQ_ERROR] == b"watermark timestamp function: KeyError: 'ts'"


def test_on_error_is_checked(kafka_broker: KafkaBroker) -> None:
    with pytest.raises(ConfigError, match="on_error must be 'fail' or DeadLetter"):
        KafkaSource("b:9092", "t", on_error="skip")
    with pytest.raises(ConfigError, match="transactional_id_prefix"):
        DeadLetter("bad", transactional_id_prefix="")
    assert "secret" not in repr(DeadLetter("bad", "p", producer_config={"sasl.password": "secret"}))
    topic = kafka_broker.create_topic()
    src = KafkaSource(kafka_broker.bootstrap_servers, topic, discovery_interval_s=None,
                      on_error=DeadLetter("no-such-dlq", transactional_id_prefix="p"))  # fmt: skip
    with pytest.raises(KafkaError, match="dead-letter topic 'no-such-dlq' does not exist on .*; create it first"):
        src.open_splits({split_id(topic, 0): None}, None)


# -- a wrong bootstrap address ----------------------------------------------------------------------


def _sink_operator(sink: KafkaSink, root: RootSpec) -> Any:
    host = SimpleNamespace(job=SimpleNamespace(store=root.open()), restore_meta=None)
    ctx = SimpleNamespace(host=host, subtask=0, parallelism=1, run_id="r" * 8, attempt=1)
    op = sink.create_operator("out")
    op.setup(ctx, None)
    op.open()
    return op


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once", "none"])
def test_a_sink_with_a_wrong_address_fails_as_the_source_does(
    delivery: str, file_root: RootSpec
) -> None:
    bad = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    with pytest.raises(KafkaError) as source_error:  # both wait metadata_timeout_s (10 s by default)
        KafkaSource(bad, "t", metadata_timeout_s=1.0).splits()
    t0 = time.monotonic()
    with pytest.raises(KafkaError) as sink_error:
        _sink_operator(KafkaSink(bad, "t", delivery=delivery, transactional_id_prefix="p", metadata_timeout_s=1.0),
                       file_root)
    assert time.monotonic() - t0 < 15  # not 30 s per producer call
    for err, who in ((source_error, "KafkaSource"), (sink_error, "KafkaSink out")):
        assert re.fullmatch(rf"{who} could not list the topics of {re.escape(bad)} \(.*\); is the broker reachable\?",
                            str(err.value)), str(err.value)  # fmt: skip


def test_kafka_offsets_with_a_wrong_address_raise_a_config_error_naming_it() -> None:
    bad = f"127.0.0.1:{free_ports(1)[0]}"
    offsets = KafkaOffsets({"bootstrap.servers": bad, "group.id": "g"}, "t", timeout_s=1)
    try:
        with pytest.raises(ConfigError, match=rf"could not list the topics of {re.escape(bad)} \(.*\); "
                                              r"is the broker reachable\?"):  # fmt: skip
            offsets.restore(None)
    finally:
        offsets.consumer.close()
    consumer = Consumer({"bootstrap.servers": bad, "group.id": "g"})
    try:  # a Consumer does not tell its address: still a ConfigError that says what to check
        with pytest.raises(ConfigError, match=r"consumer's bootstrap.servers .*is the broker reachable\?"):
            KafkaOffsets(consumer, "t", timeout_s=1).restore(None)
    finally:
        consumer.close()


def test_kafka_offsets_from_consumer_settings(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    offsets = KafkaOffsets(kafka_broker.config(**{"group.id": "g"}), topic)
    try:
        assert offsets.restore(None) == {topic: {0: 0, 1: 0}}
    finally:
        offsets.consumer.close()
    with pytest.raises(ConfigError, match="consumer settings were refused"):
        KafkaOffsets({"bootstrap.servers": kafka_broker.bootstrap_servers, "no.such.setting": 1}, topic)


# -- a broker restart while a sink produces -------------------------------------------------------------


def test_a_fatal_producer_error_after_a_broker_restart_is_reported_as_itself(tmp_path: Path, file_root: RootSpec) -> None:
    with start_kafka(tmp_path / "kafka") as broker:
        topic = broker.create_topic()
        gc.collect()  # clients other tests left to the collector go now, not during this test
        clients = client_handles()
        op = _sink_operator(KafkaSink(broker.bootstrap_servers, topic, delivery="at-least-once"), file_root)
        i = 0
        with pytest.raises(KafkaError) as info:
            for rnd in range(5):  # until it happens: usually in the first round
                for _ in range(1000):
                    op.process({"i": i}, None, 0)
                    i += 1
                op.snapshot(2 * rnd + 1)  # flushed: the broker acknowledged them ...
                broker.restart(kill=True)  # ... and lost them (and the idempotent producer's sequence)
                for _ in range(1000):
                    op.process({"i": i}, None, 0)
                    i += 1
                op.snapshot(2 * rnd + 2)  # the producer's sequence numbers no longer match the broker's
        # closed before its broker stops: a producer left open (the traceback keeps the operator)
        # reconnects to the stopped broker until the session ends
        op.close()
        gc.collect()  # the traceback in ``info`` still keeps the operator: only a closed producer is gone
        assert client_handles() == clients, "the sink's producer outlived close()"
    err = info.value
    # as the client's fatal error, or (when a delivery callback served after it cleared the
    # client's exception: a bare SystemError) as a fatal error whose description was lost
    assert re.match(rf"KafkaSink out \('{topic}'\): (flush|poll) failed: (KafkaError{{FATAL,code=|the client lost)",
                    str(err)), str(err)
    assert "a fatal producer error" in str(err)
    assert err.__cause__ is None and err.__suppress_context__  # no SystemError chained to it


def test_a_producer_call_that_lost_its_fatal_error_is_reported_as_a_fatal_error() -> None:
    # the client's bare SystemError ("returned NULL without setting an exception") after a
    # delivery callback cleared its fatal exception: the producer call stands in for flush
    from runtime.connectors.kafka.sink import KafkaSinkOperator

    op = KafkaSinkOperator("out", KafkaSink("127.0.0.1:1", "t", delivery="at-least-once"))
    op._on_delivery("Local: Purged in queue", None)

    def flush(timeout: float) -> int:
        raise SystemError("<built-in method flush> returned NULL without setting an exception")

    with pytest.raises(KafkaError) as info:
        op._call("flush", flush, 1.0)
    text = str(info.value)
    assert text.startswith("KafkaSink out ('t'): flush failed: the client lost the description of its error"), text
    assert "the first failed delivery: Local: Purged in queue" in text and "a fatal producer error" in text
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert op._call("poll", lambda timeout: 0, 0.0) == 0  # a call that succeeds returns its result
