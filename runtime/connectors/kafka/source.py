"""The Kafka source: offsets in checkpoints. Design: ``docs/kafka.md``.

Every partition of the subscribed topics is a split ``"<topic>:<partition>"``; the job
master assigns them to source subtasks like any split. A source subtask reads all its
partitions with one ``confluent_kafka.Consumer`` (``assign``, never ``subscribe``;
:mod:`~runtime.connectors.kafka.reader`) and records per partition the next offset to
read, ``{"offset": n}`` (plus ``"stop"`` when bounded and ``"max_ts"``), in every
checkpoint. A restore seeks to those offsets; the consumer group's committed offsets are
never the truth (``commit_offsets=True`` commits the positions of a completed checkpoint
for monitoring). A fresh job starts every partition at ``starting_offsets``:
``"earliest"``, ``"latest"``, ``"committed"`` (the group's, else earliest) or an int
timestamp in ms; a partition that a restored job did not know starts at the earliest
offset. Partition discovery: every ``discovery_interval_s`` each subtask lists the topics;
a partition it did not see when it opened is read by subtask
``(crc32(topic) + partition) % parallelism``. Event time:
:data:`~runtime.connectors.kafka.records.RECORD_TIMESTAMP` as the ``WatermarkStrategy``'s
timestamp function takes the record's Kafka timestamp; watermarks are per partition (the
subtask's is their minimum), and a partition without records for ``idle_timeout_ms`` does
not hold it back. A record the deserializers (or the watermark timestamp function) cannot
read fails the job with a :class:`~runtime.connectors.kafka.client.KafkaError` naming its
topic, partition and offset; with ``on_error=DeadLetter(topic, ...)`` the raw record goes
to a dead-letter topic instead, in a Kafka transaction committed at the checkpoint barrier
that follows it (:class:`~runtime.connectors.kafka.dead_letter.DeadLetter`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from runtime.connectors.kafka.client import (
    METADATA_TIMEOUT_S,
    KafkaError,
    check_config,
    check_metadata_timeout,
    list_topics,
    require_kafka,
)
from runtime.connectors.kafka.dead_letter import DeadLetter
from runtime.connectors.kafka.reader import KafkaSourceSplits
from runtime.connectors.kafka.records import COMMITTED, EARLIEST, LATEST, split_id
from runtime.connectors.sources import Source, SourceSplits, SplitReader, WatermarkStrategy
from runtime.errors import JobGraphError


class KafkaSource(Source):
    """Reads Kafka topics with offsets in the checkpoints (see the module docstring)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: str | list[str] | None = None,
        *,
        pattern: str | None = None,
        group_id: str = "statelog",
        starting_offsets: str | int = EARLIEST,
        bounded: bool = False,
        key_deserializer: Callable[[bytes | None], Any] | None = None,
        value_deserializer: Callable[[bytes | None], Any] | None = None,
        emit: str = "value",
        idle_timeout_ms: int | None = None,
        discovery_interval_s: float | None = 10.0,
        commit_offsets: bool = False,
        consumer_config: Mapping[str, Any] | None = None,
        records_per_s: float | None = None,
        on_error: str | DeadLetter = "fail",
        metadata_timeout_s: float = METADATA_TIMEOUT_S,
    ) -> None:
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers:
            raise JobGraphError(f"KafkaSource bootstrap_servers must be 'host:port[,...]', got {bootstrap_servers!r}")
        if isinstance(topics, str):
            topics = [topics]
        if (topics is None) == (pattern is None):
            raise JobGraphError("KafkaSource needs exactly one of topics= (a name or list) and pattern= (a regex)")
        if topics is not None and (not topics or not all(isinstance(t, str) and t and ":" not in t for t in topics)):
            raise JobGraphError(f"KafkaSource topics must be non-empty topic names, got {topics!r}")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise JobGraphError(f"KafkaSource pattern {pattern!r} is not a regular expression: {e}") from None
        if not (starting_offsets in (EARLIEST, LATEST, COMMITTED) or (
                type(starting_offsets) is int and starting_offsets >= 0)):  # fmt: skip
            raise JobGraphError(
                f"KafkaSource starting_offsets must be 'earliest', 'latest', 'committed' or a timestamp in ms "
                f"(int >= 0), got {starting_offsets!r}"
            )
        if emit not in ("value", "record"):
            raise JobGraphError(f"KafkaSource emit must be 'value' or 'record' (a KafkaRecord), got {emit!r}")
        if idle_timeout_ms is not None and (type(idle_timeout_ms) is not int or idle_timeout_ms <= 0):
            raise JobGraphError(f"KafkaSource idle_timeout_ms must be an int > 0 or None, got {idle_timeout_ms!r}")
        if discovery_interval_s is not None and not (
                isinstance(discovery_interval_s, (int, float)) and discovery_interval_s > 0):  # fmt: skip
            raise JobGraphError(f"KafkaSource discovery_interval_s must be > 0 or None, got {discovery_interval_s!r}")
        if on_error != "fail" and not isinstance(on_error, DeadLetter):
            raise JobGraphError(
                f"KafkaSource on_error must be 'fail' or DeadLetter(topic, transactional_id_prefix=...), got {on_error!r}"
            )
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics) if topics is not None else None
        self.pattern = pattern
        self.group_id = group_id
        self.starting_offsets = starting_offsets
        self.bounded = bool(bounded)
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.emit = emit
        self.idle_timeout_ms = idle_timeout_ms
        self.discovery_interval_s = discovery_interval_s
        self.commit_offsets = commit_offsets
        self.consumer_config = check_config("KafkaSource consumer_config", consumer_config)
        self.records_per_s = records_per_s
        self.on_error = on_error
        # how long opening waits for the cluster's metadata before it calls the address unreachable
        self.metadata_timeout_s = check_metadata_timeout("KafkaSource", metadata_timeout_s)

    def __repr__(self) -> str:
        return f"KafkaSource({self.bootstrap_servers!r}, topics={self.topics!r}, pattern={self.pattern!r})"

    def config(self) -> dict[str, Any]:
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
        conf.update(self.consumer_config)
        return conf

    def list_partitions(self, client: Any, timeout: float | None = None) -> list[tuple[str, int]]:
        """Every (topic, partition) this source reads, from the cluster's metadata."""
        md = list_topics(client, self.bootstrap_servers, "KafkaSource",
                         self.metadata_timeout_s if timeout is None else timeout)
        out = []
        if self.topics is not None:
            for t in self.topics:
                tm = md.topics.get(t)
                if tm is None or tm.error is not None or not tm.partitions:
                    raise KafkaError(
                        f"topic {t!r} does not exist on {self.bootstrap_servers}"
                        + (f" ({tm.error})" if tm is not None and tm.error else "")
                        + "; create it first or fix the name"
                    )
                out += [(t, p) for p in tm.partitions]
        else:
            assert self.pattern is not None
            rx = re.compile(self.pattern)
            for t, tm in md.topics.items():
                if rx.fullmatch(t) and not t.startswith("__") and tm.error is None:
                    out += [(t, p) for p in tm.partitions]
        return sorted(out)

    def splits(self) -> list[str]:
        ck = require_kafka()
        consumer = ck.Consumer(self.config())
        try:
            return [split_id(t, p) for t, p in self.list_partitions(consumer)]
        finally:
            consumer.close()

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        raise JobGraphError("KafkaSource reads its partitions together: the runtime calls open_splits")

    def open_splits(
        self,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
        *,
        subtask: int = 0,
        parallelism: int = 1,
        restored: bool = False,
    ) -> SourceSplits:
        return KafkaSourceSplits(self, assigned, watermarks, subtask, parallelism, restored)
