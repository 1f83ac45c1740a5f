"""What a Kafka source reads and how it names it: its splits (``"<topic>:<partition>"``),
where a fresh job starts, the record it emits with ``emit="record"`` and the marker of the
Kafka record timestamp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import JobGraphError

# KafkaSource(starting_offsets=...) besides a timestamp in ms
EARLIEST = "earliest"
LATEST = "latest"
COMMITTED = "committed"


def RECORD_TIMESTAMP(value: Any) -> int:  # noqa: N802 - a marker used like a constant
    """Timestamp function of a ``WatermarkStrategy`` on a :class:`KafkaSource`: the record's
    Kafka timestamp (create or log-append time). Only the Kafka source can call it."""
    raise JobGraphError("RECORD_TIMESTAMP is the Kafka record timestamp: use it with a KafkaSource only")


@dataclass(frozen=True)
class KafkaRecord:
    """A consumed record, emitted by ``KafkaSource(..., emit="record")``."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes], ...] = ()


def split_id(topic: str, partition: int) -> str:
    return f"{topic}:{partition:05d}"


def parse_split(split: str) -> tuple[str, int]:
    topic, sep, part = split.rpartition(":")
    if not sep or not part.isdigit():
        raise JobGraphError(f"{split!r} is not a Kafka split '<topic>:<partition>'")
    return topic, int(part)

