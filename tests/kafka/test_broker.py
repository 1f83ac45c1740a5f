"""Broker conformance: the Kafka semantics statelog's connectors rely on (noida-db)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kafka


def test_broker_smoke(kafka_broker) -> None:
    topic = kafka_broker.create_topic(partitions=3)
    assert topic.startswith("t-")
