"""KafkaSink's exactly-once recovery, driven directly (no job): a lost commit is re-written
once, a commit whose pre-commit object was left behind is not repeated, zombies are fenced."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from runtime.connectors.kafka import KafkaSink
from runtime.connectors.kafka.sink import SINK_PREFIX
from tests.support.kafka.jobs import read_topic
from tests.support.s3server import RootSpec

pytestmark = pytest.mark.kafka


def _operator(sink: KafkaSink, store, attempt: int, restored: int | None):
    host = SimpleNamespace(job=SimpleNamespace(store=store),
                           restore_meta=SimpleNamespace(checkpoint_id=restored) if restored is not None else None)  # fmt: skip
    ctx = SimpleNamespace(host=host, subtask=0, parallelism=1, run_id="r" * 8, attempt=attempt)
    op = sink.create_operator("out")
    op.setup(ctx, None)
    op.open()
    return op


def test_lost_commit_is_rewritten_once_and_zombies_are_fenced(kafka_broker, file_root: RootSpec) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    sink = KafkaSink(kafka_broker.bootstrap_servers, topic, transactional_id_prefix=f"t-{uuid.uuid4().hex[:6]}")
    store = file_root.open()
    a1 = _operator(sink, store, 1, None)
    for i in range(3):
        a1.process({"i": i}, None, 0)
    a1.snapshot(1)  # pre-committed; checkpoint 1 completes but the worker dies before committing
    assert len(list(store.list(SINK_PREFIX))) == 1
    a1.process({"i": 99}, None, 0)  # after the barrier: must never be visible
    a1.current.producer.flush(10)

    a2 = _operator(sink, store, 2, restored=1)  # recovery: re-writes checkpoint 1's records
    assert sorted(r["i"] for r in read_topic(kafka_broker, topic)) == [0, 1, 2]
    assert not list(store.list(SINK_PREFIX))
    zombie = a1.pending[0].producer
    with pytest.raises(Exception):  # noqa: B017 - fenced: its epoch is stale
        zombie.commit_transaction(10)

    a2.process({"i": 3}, None, 0)
    a2.snapshot(2)
    (key,) = [o.key for o in store.list(SINK_PREFIX)]
    body = store.get(key)
    a2.checkpoint_complete(2)  # committed, object deleted ...
    store.put(key, body)  # ... but pretend the delete was lost (a kill between the two)

    _operator(sink, store, 3, restored=2)  # the marker says committed: not written again
    assert sorted(r["i"] for r in read_topic(kafka_broker, topic)) == [0, 1, 2, 3]
    assert not list(store.list(SINK_PREFIX))


def test_pre_commit_of_an_uncompleted_checkpoint_is_dropped(kafka_broker, file_root: RootSpec) -> None:
    topic = kafka_broker.create_topic(partitions=1)
    sink = KafkaSink(kafka_broker.bootstrap_servers, topic, transactional_id_prefix=f"t-{uuid.uuid4().hex[:6]}")
    store = file_root.open()
    a1 = _operator(sink, store, 1, None)
    a1.process({"i": 0}, None, 0)
    a1.snapshot(1)
    a1.checkpoint_complete(1)
    a1.process({"i": 1}, None, 0)
    a1.snapshot(2)  # checkpoint 2 never completes
    _operator(sink, store, 2, restored=1)
    assert [r["i"] for r in read_topic(kafka_broker, topic)] == [0]
    assert not list(store.list(SINK_PREFIX))
