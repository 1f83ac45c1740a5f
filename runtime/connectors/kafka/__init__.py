"""Kafka for the runtime. Design: ``docs/kafka.md``.

* :class:`KafkaSource` (:mod:`~runtime.connectors.kafka.source`, reading in
  :mod:`~runtime.connectors.kafka.reader`): every partition is a split, its offset a source
  position in every checkpoint; records it cannot read fail the job or go to a
  :class:`DeadLetter` topic (:mod:`~runtime.connectors.kafka.dead_letter`).
* :class:`KafkaSink` (:mod:`~runtime.connectors.kafka.sink`): none, at-least-once or
  exactly-once by Kafka transactions committed with the checkpoints.
* :mod:`~runtime.connectors.kafka.client`: the confluent-kafka client (the ``kafka``
  extra) and :class:`KafkaError`; :mod:`~runtime.connectors.kafka.records`: split ids,
  starting offsets, :class:`KafkaRecord` and :data:`RECORD_TIMESTAMP`.
"""

from runtime.connectors.kafka.client import KafkaError
from runtime.connectors.kafka.dead_letter import (
    DLQ_ERROR,
    DLQ_OFFSET,
    DLQ_PARTITION,
    DLQ_TOPIC,
    DeadLetter,
)
from runtime.connectors.kafka.records import (
    COMMITTED,
    EARLIEST,
    LATEST,
    RECORD_TIMESTAMP,
    KafkaRecord,
)
from runtime.connectors.kafka.sink import KafkaSink
from runtime.connectors.kafka.source import KafkaSource

__all__ = [
    "COMMITTED",
    "DLQ_ERROR",
    "DLQ_OFFSET",
    "DLQ_PARTITION",
    "DLQ_TOPIC",
    "EARLIEST",
    "LATEST",
    "RECORD_TIMESTAMP",
    "DeadLetter",
    "KafkaError",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSource",
]
