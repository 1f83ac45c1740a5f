"""The runtime's KafkaSource and KafkaSink without failures: the golden output, offsets in
the checkpoints, starting offsets, watermarks from record timestamps, bad input."""

from __future__ import annotations

import uuid

import pytest

import statelog
from runtime.kafka import split_id
from tests.kafka.runtime_jobs import build_kafka_clicks, clicks_env, produce_clicks, read_topic
from tests.runtime import jobs
from tests.s3server import RootSpec

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
