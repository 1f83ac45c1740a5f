"""Dead letters: the records a Kafka source cannot read, written to a dead-letter topic in
a Kafka transaction committed at the checkpoint barrier that follows them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.connectors.kafka.client import (
    METADATA_TIMEOUT_S,
    PRODUCER_ONLY,
    KafkaError,
    check_config,
    kafka_call,
    list_topics,
    require_kafka,
)
from runtime.errors import JobGraphError

log = logging.getLogger(__name__)

# headers a dead-lettered record gets (after its own headers)
DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET, DLQ_ERROR = (
    "statelog.dlq.topic", "statelog.dlq.partition", "statelog.dlq.offset", "statelog.dlq.error")  # fmt: skip


@dataclass(frozen=True)
class DeadLetter:
    """Where ``KafkaSource(..., on_error=DeadLetter(...))`` sends the records it cannot read.

    A record whose ``key_deserializer``/``value_deserializer`` (or the watermark timestamp
    function) raises is produced as it was read -- raw key, raw value, its headers -- to
    ``topic``, with the headers :data:`DLQ_TOPIC`, :data:`DLQ_PARTITION`, :data:`DLQ_OFFSET`
    (where it was read) and :data:`DLQ_ERROR` (``"<stage>: <exception type>: <message>"``,
    the stage being ``value_deserializer``, ``key_deserializer`` or ``watermark timestamp
    function``) added, and
    the job goes on without it. Exactly once with the checkpoints: each source subtask writes
    its dead letters in a Kafka transaction (transactional id ``<prefix>-<subtask>``) that it
    commits at the next checkpoint barrier, before it acknowledges the checkpoint, together
    with the source positions as the offsets of the consumer group ``<prefix>-dead-letters``;
    after a restore a bad record below those offsets is not produced again. Readers of the
    dead-letter topic use ``isolation.level=read_committed``.

    ``topic`` is on the source's cluster (the consumer group's offsets name the source's
    partitions). ``transactional_id_prefix``: unique per job and source (two sources with
    the same prefix fence each other). ``producer_config``: librdkafka settings of its
    producer (the source's ``consumer_config`` is not copied: give security settings here too)."""

    topic: str
    transactional_id_prefix: str
    producer_config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise JobGraphError(f"DeadLetter topic must be a topic name, got {self.topic!r}")
        if not isinstance(self.transactional_id_prefix, str) or not self.transactional_id_prefix:
            raise JobGraphError(
                "DeadLetter needs transactional_id_prefix=, unique per job and source (e.g. 'clicks-job-bad'), "
                f"got {self.transactional_id_prefix!r}"
            )
        object.__setattr__(self, "producer_config", check_config("DeadLetter producer_config", self.producer_config))

    def __repr__(self) -> str:  # producer_config may hold credentials
        return f"DeadLetter({self.topic!r}, transactional_id_prefix={self.transactional_id_prefix!r})"


class DeadLetterProducer:
    """The dead-letter producer of one source subtask: a Kafka transaction per checkpoint
    (see :class:`DeadLetter`)."""

    def __init__(self, bootstrap_servers: str, dl: DeadLetter, subtask: int, timeout_s: float = 30.0,
                 metadata_timeout_s: float = METADATA_TIMEOUT_S) -> None:
        ck = self.ck = require_kafka()
        self.dl, self.subtask, self.timeout_s = dl, subtask, timeout_s
        conf = {"bootstrap.servers": bootstrap_servers, "linger.ms": 5, **(dl.producer_config or {})}
        self.txn_id = f"{dl.transactional_id_prefix}-{subtask}"
        self.what = f"KafkaSource dead letters to {dl.topic!r} (transactional id {self.txn_id!r})"
        self.producer = ck.Producer({**conf, "transactional.id": self.txn_id})
        self.markers = ck.Consumer({
            **{k: v for k, v in conf.items() if k not in PRODUCER_ONLY},
            "group.id": f"{dl.transactional_id_prefix}-dead-letters",
            "enable.auto.commit": False,
        })  # fmt: skip
        try:
            md = list_topics(self.markers, bootstrap_servers, self.what, metadata_timeout_s)
            tm = md.topics.get(dl.topic)
            if tm is None or tm.error is not None or not tm.partitions:
                raise KafkaError(f"dead-letter topic {dl.topic!r} does not exist on {bootstrap_servers}"
                                 + (f" ({tm.error})" if tm is not None and tm.error else "")
                                 + "; create it first or fix the name")  # fmt: skip
            # fences zombies of this subtask and aborts their open transaction
            kafka_call(f"{self.what}: init_transactions", self.producer.init_transactions, timeout_s)
        except BaseException:
            self.markers.close()
            raise
        self.done: dict[tuple[str, int], int] = {}  # bad records below these offsets are dead-lettered
        self.open = False
        self.sent = 0
        self.skipped = 0
        self._errors: list[str] = []

    def load(self, parts: list[tuple[str, int]]) -> None:
        """The offsets up to which the dead letters of ``parts`` were committed."""
        if not parts:
            return
        tps = [self.ck.TopicPartition(t, p) for t, p in parts]
        for tp in kafka_call(f"{self.what}: reading its committed offsets", self.markers.committed, tps,
                             timeout=self.timeout_s):  # fmt: skip
            if tp.offset is not None and tp.offset >= 0:
                self.done[(tp.topic, tp.partition)] = tp.offset

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(str(err))

    def send(self, m: Any, stage: str, error: Exception) -> None:
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        if offset < self.done.get((topic, partition), -1):  # committed before a restore
            self.skipped += 1
            return
        if not self.open:
            kafka_call(f"{self.what}: begin_transaction", self.producer.begin_transaction)
            self.open = True
        why = f"{stage}: {type(error).__name__}: {error}"[:2000]
        headers = [*(m.headers() or ()), (DLQ_TOPIC, topic.encode()), (DLQ_PARTITION, str(partition).encode()),
                   (DLQ_OFFSET, str(offset).encode()), (DLQ_ERROR, why.encode())]  # fmt: skip
        if self.sent == 0:
            log.warning("source subtask %d: the record at offset %d of %s[%d] goes to dead-letter topic %r (%s)",
                        self.subtask, offset, topic, partition, self.dl.topic, why)  # fmt: skip
        while True:
            try:
                kafka_call(f"{self.what}: produce", self.producer.produce, self.dl.topic, m.value(), m.key(),
                           headers=headers, on_delivery=self._on_delivery)  # fmt: skip
                break
            except BufferError:  # the local queue is full: let it drain
                kafka_call(f"{self.what}: poll", self.producer.poll, 0.05)
        self.sent += 1

    def commit(self, positions: dict[tuple[str, int], int]) -> None:
        """At a barrier: commit the open transaction with ``positions`` as its offsets."""
        if not self.open:
            return
        left = kafka_call(f"{self.what}: flush", self.producer.flush, self.timeout_s)
        if left:
            raise KafkaError(f"{self.what}: {left} records not delivered within {self.timeout_s}s")
        if self._errors:
            errs, self._errors = self._errors, []
            raise KafkaError(f"{self.what}: delivery failed: {errs[0]} ({len(errs)} records)")
        upto = {k: max(off, self.done.get(k, -1)) for k, off in positions.items()}  # never lower them
        offsets = [self.ck.TopicPartition(t, p, off) for (t, p), off in sorted(upto.items())]
        kafka_call(f"{self.what}: send_offsets_to_transaction", self.producer.send_offsets_to_transaction,
                   offsets, self.markers.consumer_group_metadata(), self.timeout_s)  # fmt: skip
        kafka_call(f"{self.what}: commit_transaction", self.producer.commit_transaction, self.timeout_s)
        self.open = False
        self.done.update(upto)
        log.info("source subtask %d: %d records dead-lettered to %r so far (%d already there before a restore)",
                 self.subtask, self.sent, self.dl.topic, self.skipped)  # fmt: skip

    def close(self) -> None:
        # an open transaction stays open: the next attempt's init_transactions aborts it
        self.markers.close()

