"""The Kafka sink: none / at-least-once / exactly-once by Kafka transactions.
Design: ``docs/kafka.md``.

``delivery="none"`` produces and never waits; ``"at-least-once"`` flushes on
every barrier before acknowledging (replays repeat records); ``"exactly-once"`` writes
Kafka transactions committed as Flink's two-phase commit: each sink subtask writes into a
transaction (transactional id ``<prefix>-<subtask>-<slot>``, a small pool per subtask); on
barrier ``n`` it flushes the transaction and writes a pre-commit object (its records and
transactional id) below the job root, then starts the next transaction with the next free
slot; when checkpoint ``n`` completes it commits every pre-committed transaction of a
checkpoint ``<= n`` and deletes their objects. A restarted subtask first initialises every
transactional id of its pool, which fences zombie producers and aborts their open
transactions, then re-writes and commits the records of every pre-commit object of a
checkpoint ``<=`` the restored one (its commit was lost) and deletes the others (their
records are produced again from the restored positions).

A sink subtask lists the cluster's topics when it opens, as the source does
(:func:`~runtime.connectors.kafka.client.list_topics`).
"""

from __future__ import annotations

import json
import logging
import pickle
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from runtime.connectors.kafka.client import (
    FATAL_MEANING,
    METADATA_TIMEOUT_S,
    PRODUCER_ONLY,
    KafkaError,
    check_config,
    check_metadata_timeout,
    kafka_call,
    list_topics,
    require_kafka,
)
from runtime.connectors.sinks import Sink
from runtime.errors import JobGraphError
from runtime.task.operators import OperatorSnapshot, StreamOperator

log = logging.getLogger(__name__)

DELIVERY = ("none", "at-least-once", "exactly-once")
SINK_PREFIX = "runtime/kafka-sink/"


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class KafkaSink(Sink):
    """Writes records to a Kafka topic with the given delivery guarantee (module docstring)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        delivery: str = "exactly-once",
        transactional_id_prefix: str | None = None,
        value_serializer: Callable[[Any], bytes] | None = None,
        key_serializer: Callable[[Any], bytes | None] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        pool_size: int = 3,
        metadata_timeout_s: float = METADATA_TIMEOUT_S,
    ) -> None:
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers:
            raise JobGraphError(f"KafkaSink bootstrap_servers must be 'host:port[,...]', got {bootstrap_servers!r}")
        if not isinstance(topic, str) or not topic:
            raise JobGraphError(f"KafkaSink topic must be a topic name, got {topic!r}")
        if delivery not in DELIVERY:
            raise JobGraphError(f"KafkaSink delivery must be one of {list(DELIVERY)}, got {delivery!r}")
        if delivery == "exactly-once" and not (isinstance(transactional_id_prefix, str) and transactional_id_prefix):
            raise JobGraphError(
                "KafkaSink delivery='exactly-once' needs transactional_id_prefix=, unique per job and sink "
                "(e.g. 'clicks-job-out'): two jobs with the same prefix fence each other"
            )
        if type(pool_size) is not int or pool_size < 2:
            raise JobGraphError(f"KafkaSink pool_size must be an int >= 2, got {pool_size!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.delivery = delivery
        self.prefix = transactional_id_prefix
        self.value_serializer = value_serializer
        self.key_serializer = key_serializer
        self.producer_config = check_config("KafkaSink producer_config", producer_config)
        self.pool_size = pool_size
        # how long opening waits for the cluster's metadata before it calls the address unreachable
        self.metadata_timeout_s = check_metadata_timeout("KafkaSink", metadata_timeout_s)

    def __repr__(self) -> str:
        return f"KafkaSink({self.bootstrap_servers!r}, {self.topic!r}, delivery={self.delivery!r})"

    def create_operator(self, uid: str) -> StreamOperator:
        require_kafka()
        return KafkaSinkOperator(uid, self)

    def config(self, **extra: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "linger.ms": 5}
        if self.delivery != "none":
            conf["enable.idempotence"] = True
        conf.update(self.producer_config)
        conf.update(extra)
        return conf


class _Txn:
    """One transaction of an exactly-once sink subtask: its producer and its records."""

    def __init__(self, slot: int, txn_id: str, producer: Any) -> None:
        self.slot, self.txn_id, self.producer = slot, txn_id, producer
        self.records: list[tuple[bytes | None, bytes]] = []
        self.checkpoint: int | None = None
        self.key: str | None = None  # its pre-commit object


class KafkaSinkOperator(StreamOperator):
    name = "kafka-sink"

    def __init__(self, uid: str, sink: KafkaSink) -> None:
        super().__init__(uid)
        self.sink = sink
        self._errors: list[str] = []
        self.timeout_s = 30.0

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        ck = require_kafka()
        self.ck = ck
        sink = self.sink
        self.vser = sink.value_serializer or _json_bytes
        self.kser = sink.key_serializer
        # the cluster answers: checked as the source checks it (same timeout, same words)
        list_topics(ck.admin.AdminClient(sink.config()), sink.bootstrap_servers, f"KafkaSink {self.uid}",
                    sink.metadata_timeout_s)
        if sink.delivery != "exactly-once":
            self.producer = ck.Producer(sink.config())
            return
        host = self.ctx.host  # type: ignore[attr-defined]
        self.store = host.job.store
        meta = host.restore_meta
        self.restored_id = meta.checkpoint_id if meta is not None else None
        self.tag = f"{self.ctx.run_id[:8]}-a{self.ctx.attempt}"
        self.markers: dict[int, Any] = {}  # subtask -> a consumer of its marker group
        # initialise the whole pool: fences zombies and aborts their open transactions
        self.free: list[_Txn] = []
        for slot in range(sink.pool_size):
            self.free.append(self._init(slot))
        self._recover()
        self.pending: list[_Txn] = []
        self.current = self._begin()

    def _txn_id(self, slot: int, subtask: int | None = None) -> str:
        return f"{self.sink.prefix}-{self.ctx.subtask if subtask is None else subtask}-{slot}"

    def _init(self, slot: int, subtask: int | None = None) -> _Txn:
        txn_id = self._txn_id(slot, subtask)
        producer = self.ck.Producer(self.sink.config(**{"transactional.id": txn_id}))
        self._call(f"init_transactions of {txn_id!r}", producer.init_transactions, self.timeout_s)
        return _Txn(slot, txn_id, producer)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A producer call that may serve delivery callbacks, with its failure as a KafkaError.

        confluent-kafka reports a fatal producer error by raising it from inside the call that
        served it (a user's ``error_cb`` never sees it). A delivery callback served after it can
        clear that exception; the call then fails with a bare ``SystemError`` ("returned NULL
        without setting an exception"), which is reported here as the fatal error it stands for."""
        label = f"KafkaSink {self.uid} ({self.sink.topic!r}): {what}"
        try:
            return kafka_call(label, fn, *args, **kwargs)
        except SystemError:
            seen = f"; the first failed delivery: {self._errors[0]}" if self._errors else ""
            raise KafkaError(f"{label} failed: the client lost the description of its error{seen}"
                             f"{FATAL_MEANING}") from None  # fmt: skip

    def _marker_consumer(self, subtask: int) -> Any:
        c = self.markers.get(subtask)
        if c is None:
            c = self.markers[subtask] = self.ck.Consumer({
                **{k: v for k, v in self.sink.config().items() if k not in PRODUCER_ONLY},
                "group.id": f"{self.sink.prefix}-{subtask}-commits",
                "enable.auto.commit": False,
            })  # fmt: skip
        return c

    def _mark(self, txn: _Txn, checkpoint_id: int, subtask: int | None = None) -> None:
        """Inside the transaction: its commit marker, the offset ``checkpoint_id + 1`` of
        partition 0 of the topic in the subtask's marker group, committed with it or not at all."""
        sub = self.ctx.subtask if subtask is None else subtask
        tp = self.ck.TopicPartition(self.sink.topic, 0, checkpoint_id + 1)
        self._call(f"send_offsets_to_transaction of {txn.txn_id!r}", txn.producer.send_offsets_to_transaction,
                   [tp], self._marker_consumer(sub).consumer_group_metadata(), self.timeout_s)  # fmt: skip

    def _committed_upto(self, subtask: int) -> int:
        """The newest checkpoint whose transaction of ``subtask`` committed (by its marker), or -1."""
        tp = self.ck.TopicPartition(self.sink.topic, 0)
        (got,) = self._call("reading the commit markers", self._marker_consumer(subtask).committed, [tp],
                            timeout=self.timeout_s)  # fmt: skip
        return got.offset - 1 if got.offset is not None and got.offset >= 0 else -1

    def _prefix(self) -> str:
        return f"{SINK_PREFIX}{self.uid}/"

    def _recover(self) -> None:
        """Commit (re-write) what a completed checkpoint pre-committed, drop the rest."""
        mine = []
        p = self.ctx.parallelism
        for info in self.store.list(self._prefix()):
            name = info.key.rsplit("/", 1)[-1]
            try:
                cid_s, sub_s, _rest = name.split("-", 2)
                cid, sub = int(cid_s), int(sub_s)
            except ValueError:
                continue
            # subtask 0 takes the objects of subtasks a smaller parallelism no longer has
            if sub == self.ctx.subtask or (self.ctx.subtask == 0 and sub >= p):
                mine.append((cid, sub, info.key))
        for cid, sub, key in sorted(mine):
            if self.restored_id is not None and cid <= self.restored_id:
                if self._committed_upto(sub) >= cid:  # committed; only its object was left
                    self.store.delete(key)
                    continue
                data = pickle.loads(zlib.decompress(self.store.get(key)))
                if sub == self.ctx.subtask:
                    txn = self.free[data["slot"] % len(self.free)]
                else:  # an orphan: fence its id, then write with our own
                    self._init(data["slot"], sub).producer.flush(0)
                    txn = self.free[0]
                self._call(f"begin_transaction of {txn.txn_id!r}", txn.producer.begin_transaction)
                for k, v in data["records"]:
                    self._produce(txn.producer, k, v)
                self._flush(txn.producer)
                self._mark(txn, cid, sub)
                self._call(f"commit_transaction of {txn.txn_id!r}", txn.producer.commit_transaction, self.timeout_s)
                log.info("KafkaSink %s: committed the %d records checkpoint %d pre-committed (lost commit)",
                         self.uid, len(data["records"]), cid)  # fmt: skip
            self.store.delete(key)
        for sub in sorted({sub for _cid, sub, _key in mine if sub != self.ctx.subtask}):
            for slot in range(self.sink.pool_size):  # fence the pool of a subtask that is gone
                self._init(slot, sub)

    def _begin(self) -> _Txn:
        if not self.free:
            raise KafkaError(
                f"KafkaSink {self.uid}: {len(self.pending)} transactions wait for their checkpoint to complete, "
                f"all of pool_size={self.sink.pool_size}; raise pool_size (> tolerable failed checkpoints + 1)"
            )
        txn = self.free.pop(0)
        txn.records = []
        self._call(f"begin_transaction of {txn.txn_id!r}", txn.producer.begin_transaction)
        return txn

    # -- writing -------------------------------------------------------------------------------

    def _on_delivery(self, err: Any, msg: Any) -> None:
        """Records a failed delivery (raised by the next :meth:`_flush`); never raises."""
        if err is not None:
            self._errors.append(str(err))

    def _produce(self, producer: Any, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._call("produce", producer.produce, self.sink.topic, value, key, on_delivery=self._on_delivery)
                return
            except BufferError:  # the local queue is full: let it drain
                self._call("poll", producer.poll, 0.05)

    def _flush(self, producer: Any) -> None:
        left = self._call("flush", producer.flush, self.timeout_s)
        if left:
            raise KafkaError(f"KafkaSink {self.uid}: {left} records to {self.sink.topic!r} not delivered within "
                             f"{self.timeout_s}s")  # fmt: skip
        if self._errors:
            errs, self._errors = self._errors, []
            raise KafkaError(f"KafkaSink {self.uid}: delivery to {self.sink.topic!r} failed: {errs[0]} "
                             f"({len(errs)} records)")  # fmt: skip

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        v = self.vser(value)
        k = self.kser(value) if self.kser is not None else None
        if self.sink.delivery == "exactly-once":
            self.current.records.append((k, v))
            self._produce(self.current.producer, k, v)
        else:
            self._produce(self.producer, k, v)
            self._call("poll", self.producer.poll, 0)

    def snapshot(self, checkpoint_id: int) -> OperatorSnapshot | None:
        d = self.sink.delivery
        if d == "at-least-once":
            self._flush(self.producer)
        elif d == "exactly-once":
            txn = self.current
            self._flush(txn.producer)  # pre-commit: every record is in the broker, in the open transaction
            self._mark(txn, checkpoint_id)
            txn.checkpoint = checkpoint_id
            txn.key = f"{self._prefix()}{checkpoint_id:010d}-{self.ctx.subtask:04d}-{self.tag}"
            body = {"txn_id": txn.txn_id, "slot": txn.slot, "checkpoint": checkpoint_id, "records": txn.records}
            self.store.put(txn.key, zlib.compress(pickle.dumps(body, protocol=5), 1))
            self.pending.append(txn)
            self.current = self._begin()
        return None

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.sink.delivery != "exactly-once":
            return
        keep = []
        for txn in self.pending:
            if txn.checkpoint is not None and txn.checkpoint <= checkpoint_id:
                self._call(f"commit_transaction of {txn.txn_id!r}", txn.producer.commit_transaction, self.timeout_s)
                if txn.key is not None:
                    self.store.delete(txn.key)
                txn.records, txn.key, txn.checkpoint = [], None, None
                self.free.append(txn)
            else:
                keep.append(txn)
        self.pending = keep

    def close(self) -> None:
        if self.sink.delivery != "exactly-once":
            producer = self.__dict__.pop("producer", None)
            if producer is not None:
                try:
                    self._call("flush", producer.flush, 5)
                except KafkaError as e:  # closing after a failure: that failure is the error
                    log.warning("%s", e)
                    producer.purge()  # what was not delivered: close() would wait for it
                producer.close()  # no client left reconnecting to a broker that is gone
            return
        # open and pre-committed transactions stay as they are: the next attempt decides
        for c in self.__dict__.get("markers", {}).values():
            c.close()
