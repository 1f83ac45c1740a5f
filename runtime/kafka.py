"""Kafka for the runtime: :class:`KafkaSource` (offsets in checkpoints) and :class:`KafkaSink`
(none / at-least-once / exactly-once by Kafka transactions). Design: ``docs/kafka.md``.

**KafkaSource.** Every partition of the subscribed topics is a split ``"<topic>:<partition>"``;
the job master assigns them to source subtasks like any split. A source subtask reads all
its partitions with one ``confluent_kafka.Consumer`` (``assign``, never ``subscribe``) and
records per partition the next offset to read, ``{"offset": n}`` (plus ``"stop"`` when
bounded and ``"max_ts"``), in every checkpoint. A restore seeks to those offsets; the
consumer group's committed offsets are never the truth (``commit_offsets=True`` commits the
positions of a completed checkpoint for monitoring). A fresh job starts every partition at
``starting_offsets``: ``"earliest"``, ``"latest"``, ``"committed"`` (the group's, else
earliest) or an int timestamp in ms; a partition that a restored job did not know starts
at the earliest offset. Partition discovery: every ``discovery_interval_s`` each subtask
lists the topics; a partition it did not see when it opened is read by subtask
``(crc32(topic) + partition) % parallelism``. Event time: :data:`RECORD_TIMESTAMP` as the
``WatermarkStrategy``'s timestamp function takes the record's Kafka timestamp; watermarks
are per partition (the subtask's is their minimum), and a partition without records for
``idle_timeout_ms`` does not hold it back. A record the deserializers (or the watermark
timestamp function) cannot read fails the job with a :class:`KafkaError` naming its topic,
partition and offset; with ``on_error=DeadLetter(topic, ...)`` the raw record goes to a
dead-letter topic instead, in a Kafka transaction committed at the checkpoint barrier that
follows it (:class:`DeadLetter`).

**KafkaSink.** ``delivery="none"`` produces and never waits; ``"at-least-once"`` flushes on
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

**Errors.** A sink subtask lists the cluster's topics when it opens, as the source does
(:func:`list_topics`: :data:`METADATA_TIMEOUT_S`, "is the broker reachable?"). Client calls
that may serve callbacks go through :func:`kafka_call`, which reports a fatal producer error
as itself rather than the ``SystemError`` confluent-kafka raises for it.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

try:  # the kafka extra; the runtime imports without it
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401 - confluent_kafka.admin.AdminClient
except ImportError:  # pragma: no cover - exercised only without the extra
    confluent_kafka = None

from runtime.errors import JobGraphError, RuntimeJobError
from runtime.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.operators import OperatorSnapshot, StreamOperator
from runtime.sinks import Sink
from runtime.sources import Source, SourceSplits, SplitReader, WatermarkStrategy

log = logging.getLogger(__name__)

EARLIEST = "earliest"
LATEST = "latest"
COMMITTED = "committed"
DELIVERY = ("none", "at-least-once", "exactly-once")
SINK_PREFIX = "runtime/kafka-sink/"
_PRODUCER_ONLY = ("linger.ms", "enable.idempotence", "transactional.id", "acks", "compression.type")
EMPTY_READS_AT_END = 5  # empty polls (10 ms each) after EOF at the stop offset: a bounded partition ended
_SECRET_WORDS = ("password", "secret", "token", "key")
# how long the source and the sink wait for the cluster's metadata before they call the
# bootstrap address unreachable
METADATA_TIMEOUT_S = 10.0
# headers a dead-lettered record gets (after its own headers)
DLQ_TOPIC, DLQ_PARTITION, DLQ_OFFSET, DLQ_ERROR = (
    "statelog.dlq.topic", "statelog.dlq.partition", "statelog.dlq.offset", "statelog.dlq.error")  # fmt: skip


class KafkaError(RuntimeJobError):
    """A Kafka source or sink failed (the message names the topic and what to do)."""


def _kafka() -> Any:
    if confluent_kafka is None:
        raise JobGraphError("the Kafka source and sink need confluent-kafka: pip install 'statelog[kafka]'")
    return confluent_kafka


def list_topics(client: Any, bootstrap_servers: str, who: str, timeout: float | None = None) -> Any:
    """The cluster's metadata by ``client``; a :class:`KafkaError` naming the bootstrap
    address when it does not answer within ``timeout`` (:data:`METADATA_TIMEOUT_S`)."""
    try:
        return client.list_topics(timeout=METADATA_TIMEOUT_S if timeout is None else timeout)
    except Exception as e:  # noqa: BLE001 - KafkaException, or a closed client
        del client  # the traceback keeps this frame: a client made for the check goes now
        raise KafkaError(
            f"{who} could not list the topics of {bootstrap_servers} ({e}); is the broker reachable?"
        ) from None


def _describe(exc: BaseException) -> str:
    """A client exception in words; a fatal producer error says what it means."""
    err = exc.args[0] if exc.args else None
    text = str(err if err is not None else exc)
    if getattr(err, "fatal", None) is not None and err.fatal():
        text += (" (a fatal producer error: this producer cannot go on, e.g. the broker lost its"
                 " idempotence state in a restart; the attempt fails and the next one starts new producers)")  # fmt: skip
    return text


def kafka_call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a confluent-kafka call that may serve callbacks (poll, flush,
    transactions), with its failure as a :class:`KafkaError` saying ``what`` failed.

    After a fatal producer error confluent-kafka's error callback leaves the fatal
    ``KafkaException`` set while it goes on calling delivery callbacks, so the call raises
    ``SystemError: ... returned a result with an exception set`` from it: this reports the
    fatal error itself."""
    ck = _kafka()
    try:
        return fn(*args, **kwargs)
    except SystemError as e:
        cause = e.__cause__ if e.__cause__ is not None else e.__context__
        if not isinstance(cause, ck.KafkaException):
            raise
        raise KafkaError(f"{what} failed: {_describe(cause)}") from None
    except ck.KafkaException as e:
        raise KafkaError(f"{what} failed: {_describe(e)}") from None


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secret values (passwords, keys, tokens) replaced, for logs and errors."""
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in config.items()}


def _check_config(what: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise JobGraphError(f"{what} must be a dict of librdkafka settings, got {type(config).__name__}")
    return dict(config)


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
        object.__setattr__(self, "producer_config", _check_config("DeadLetter producer_config", self.producer_config))

    def __repr__(self) -> str:  # producer_config may hold credentials
        return f"DeadLetter({self.topic!r}, transactional_id_prefix={self.transactional_id_prefix!r})"


def split_id(topic: str, partition: int) -> str:
    return f"{topic}:{partition:05d}"


def parse_split(split: str) -> tuple[str, int]:
    topic, sep, part = split.rpartition(":")
    if not sep or not part.isdigit():
        raise JobGraphError(f"{split!r} is not a Kafka split '<topic>:<partition>'")
    return topic, int(part)


# -- source --------------------------------------------------------------------------------------


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
        self.consumer_config = _check_config("KafkaSource consumer_config", consumer_config)
        self.records_per_s = records_per_s
        self.on_error = on_error

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
        md = list_topics(client, self.bootstrap_servers, "KafkaSource", timeout)
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
        ck = _kafka()
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


class _Partition:
    __slots__ = ("topic", "partition", "next", "stop", "max_ts", "last_seen", "finished", "eof")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.next: int | None = None  # next offset to read (None: not resolved yet)
        self.stop: int | None = None
        self.max_ts: int | None = None
        self.last_seen = time.monotonic()
        self.finished = False
        self.eof: int | None = None


class KafkaSourceSplits(SourceSplits):
    """The partitions of one Kafka source subtask, read by one consumer."""

    def __init__(
        self,
        source: KafkaSource,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
        subtask: int,
        parallelism: int,
        restored: bool,
    ) -> None:
        ck = _kafka()
        self.ck = ck
        self.source = source
        self.watermarks = watermarks
        self.readers = {}
        self.subtask, self.parallelism = subtask, parallelism
        self.emitted = 0
        self._empty_reads = 0
        self._snapshots: dict[int, dict[str, dict[str, Any]]] = {}
        self.parts: dict[tuple[str, int], _Partition] = {}
        self.consumer = ck.Consumer(source.config())
        self._record_ts = watermarks is not None and watermarks.timestamp_fn is RECORD_TIMESTAMP
        new: list[_Partition] = []
        for split, pos in sorted(assigned.items()):
            t, p = parse_split(split)
            part = _Partition(t, p)
            if pos is not None:
                part.next = int(pos["offset"])
                part.stop = pos.get("stop")
                part.max_ts = pos.get("max_ts")
            else:
                new.append(part)
            self.parts[(t, p)] = part
        # a fresh job starts at starting_offsets; a partition unknown to the restored checkpoint at the start
        self._resolve(new, source.starting_offsets if not restored else EARLIEST)
        self.dead_letters: _DeadLetters | None = None
        if isinstance(source.on_error, DeadLetter):
            try:
                self.dead_letters = _DeadLetters(source, source.on_error, subtask)
                self.dead_letters.load(sorted(self.parts))
            except BaseException:
                self.close()
                raise
        self._known = set(self.parts)
        if source.discovery_interval_s is not None:
            try:
                self._known |= set(source.list_partitions(self.consumer))
            except KafkaError as e:
                log.warning("partition discovery: %s", e)
        self._next_discovery = time.monotonic() + (source.discovery_interval_s or 0)
        self._assign()

    # -- offsets -----------------------------------------------------------------------------

    def _resolve(self, parts: list[_Partition], start: str | int) -> None:
        if not parts:
            return
        ck, c = self.ck, self.consumer
        tps = [ck.TopicPartition(p.topic, p.partition) for p in parts]
        if start == COMMITTED:
            got = {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
        elif type(start) is int:
            got = {(tp.topic, tp.partition): tp.offset for tp in c.offsets_for_times(
                [ck.TopicPartition(p.topic, p.partition, start) for p in parts], timeout=10)}  # fmt: skip
        else:
            got = {}
        for p in parts:
            lo, hi = c.get_watermark_offsets(ck.TopicPartition(p.topic, p.partition), timeout=10)
            off = got.get((p.topic, p.partition), -1)
            if start == LATEST or (type(start) is int and off < 0):  # no record at/after the time: the end
                off = hi
            elif off is None or off < 0:
                off = lo
            p.next = off
            if self.source.bounded:
                p.stop = hi
        self._update_finished()

    def _update_finished(self) -> None:
        for p in self.parts.values():
            p.finished = p.stop is not None and p.next is not None and p.next >= p.stop

    def _assign(self) -> None:
        ck = self.ck
        live = [ck.TopicPartition(p.topic, p.partition, p.next) for p in self.parts.values() if not p.finished]
        self.consumer.assign(live)

    def _discover(self) -> None:
        src = self.source
        self._next_discovery = time.monotonic() + (src.discovery_interval_s or 0)
        try:
            now = set(src.list_partitions(self.consumer, timeout=5))
        except KafkaError as e:
            log.warning("partition discovery: %s", e)
            return
        fresh = sorted(now - self._known)
        self._known |= now
        mine = [tp for tp in fresh if (zlib.crc32(tp[0].encode()) + tp[1]) % self.parallelism == self.subtask]
        if not mine:
            return
        log.info("source subtask %d discovered partitions %s", self.subtask, [split_id(*tp) for tp in mine])
        parts = [_Partition(t, p) for t, p in mine]
        for p in parts:
            self.parts[(p.topic, p.partition)] = p
        self._resolve(parts, EARLIEST)
        if self.dead_letters is not None:
            self.dead_letters.load([(p.topic, p.partition) for p in parts])
        self._assign()

    # -- reading -----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.source.bounded and all(p.finished for p in self.parts.values())

    def read(self, max_records: int) -> list[tuple[Any, int | None]]:
        if self.source.discovery_interval_s is not None and time.monotonic() >= self._next_discovery:
            self._discover()
        if self.finished:
            return []
        msgs = self.consumer.consume(max_records, timeout=0.01)
        if not msgs:
            self._empty_reads += 1
            if self._empty_reads >= EMPTY_READS_AT_END and self.source.bounded:
                # the end of a bounded partition is past its last record when control records
                # (transaction markers) end it: done once EOF reached the stop and nothing came
                done = False
                for p in self.parts.values():
                    if not p.finished and p.stop is not None and p.eof is not None and p.eof >= p.stop:
                        p.finished = done = True
                if done:
                    self._assign()
            return []
        self._empty_reads = 0
        out: list[tuple[Any, int | None]] = []
        parts = self.parts
        src = self.source
        kd, vd, as_record = src.key_deserializer, src.value_deserializer, src.emit == "record"
        tsf = self.watermarks.timestamp_fn if self.watermarks is not None else None
        now = time.monotonic()
        reassign = False
        for m in msgs:
            err = m.error()
            p = parts.get((m.topic(), m.partition()))
            if err is not None:
                if err.code() == self.ck.KafkaError._PARTITION_EOF:
                    # not a position: records before it may still be queued (seen with noida-db)
                    if p is not None and m.offset() is not None:
                        p.eof = m.offset()
                    continue
                raise KafkaError(f"reading {m.topic()}[{m.partition()}] failed: {err}")
            if p is None or p.finished:
                continue
            off = m.offset()
            if p.stop is not None and off >= p.stop:  # bounded: the end recorded at the start
                p.next = p.stop
                p.finished = reassign = True
                continue
            p.next = off + 1
            p.last_seen = now
            stage = "value_deserializer"
            try:
                raw_v = m.value()
                value = vd(raw_v) if vd is not None else raw_v
                if as_record:
                    stage = "key_deserializer"
                    raw_k = m.key()
                    tstype, tsv = m.timestamp()
                    value = KafkaRecord(m.topic(), m.partition(), off, tsv if tstype else None,
                                        kd(raw_k) if kd is not None else raw_k, value,
                                        tuple(m.headers() or ()))  # fmt: skip
                ts: int | None = None
                if tsf is not None:
                    stage = "watermark timestamp function"
                    ts = m.timestamp()[1] if self._record_ts else tsf(value)
            except Exception as e:  # noqa: BLE001 - a user function on a record: fail or dead-letter it
                self._bad_record(m, stage, e)
            else:
                if ts is not None and (p.max_ts is None or ts > p.max_ts):
                    p.max_ts = ts
                out.append((value, ts))
            if p.stop is not None and p.next >= p.stop:
                p.finished = reassign = True
        if reassign:
            self._assign()
        self.emitted += len(out)
        return out

    def _bad_record(self, m: Any, stage: str, error: Exception) -> None:
        """A record ``stage`` could not read: dead-lettered, else the job fails naming it."""
        if self.dead_letters is not None:
            self.dead_letters.send(m, stage, error)
            return
        raise KafkaError(
            f"KafkaSource could not read the record at topic {m.topic()!r}, partition {m.partition()}, offset "
            f"{m.offset()}: the {stage} raised {type(error).__name__}: {error}. Fix the record's producer or "
            f"the {stage}, or send such records to a dead-letter "
            "topic with KafkaSource(..., on_error=DeadLetter(topic, transactional_id_prefix=...))"
        ) from error

    def watermark(self) -> int:
        if self.finished:
            return MAX_WATERMARK
        if self.watermarks is None:
            return MIN_WATERMARK
        lag = self.watermarks.max_out_of_orderness_ms + 1
        idle = self.source.idle_timeout_ms
        now = time.monotonic()
        wm = MAX_WATERMARK
        active = 0
        for p in self.parts.values():
            if p.finished or (idle is not None and (now - p.last_seen) * 1000 >= idle):
                continue
            active += 1
            wm = min(wm, MIN_WATERMARK if p.max_ts is None else p.max_ts - lag)
        if active == 0:  # all idle: the newest partition watermark (never back)
            seen = [p.max_ts - lag for p in self.parts.values() if p.max_ts is not None]
            return max(seen) if seen else MIN_WATERMARK
        return wm

    def positions(self) -> dict[str, dict[str, Any]]:
        out = {}
        for (t, n), p in self.parts.items():
            pos: dict[str, Any] = {"offset": p.next}
            if p.stop is not None:
                pos["stop"] = p.stop
            if p.max_ts is not None:
                pos["max_ts"] = p.max_ts
            out[split_id(t, n)] = pos
        return out

    def snapshot_positions(self, checkpoint_id: int) -> dict[str, dict[str, Any]]:
        pos = self.positions()
        if self.dead_letters is not None:  # before the checkpoint covers them: committed
            self.dead_letters.commit({k: p.next for k, p in self.parts.items() if p.next is not None})
        if self.source.commit_offsets:
            self._snapshots[checkpoint_id] = pos
        return pos

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the positions of a completed checkpoint as the group's offsets (monitoring only)."""
        done = [c for c in self._snapshots if c <= checkpoint_id]
        if not done:
            return
        positions = self._snapshots[max(done)]
        for c in done:
            del self._snapshots[c]
        tps = [self.ck.TopicPartition(*parse_split(s), int(p["offset"])) for s, p in positions.items()]
        if tps:
            try:
                self.consumer.commit(offsets=tps, asynchronous=True)
            except self.ck.KafkaException as e:  # monitoring only: never fail the job for it
                log.warning("committing the offsets of checkpoint %d failed: %s", checkpoint_id, e)

    def close(self) -> None:
        self.consumer.close()
        if self.dead_letters is not None:
            self.dead_letters.close()


class _DeadLetters:
    """The dead-letter producer of one source subtask: a Kafka transaction per checkpoint
    (see :class:`DeadLetter`)."""

    def __init__(self, source: KafkaSource, dl: DeadLetter, subtask: int, timeout_s: float = 30.0) -> None:
        ck = self.ck = _kafka()
        self.dl, self.subtask, self.timeout_s = dl, subtask, timeout_s
        conf = {"bootstrap.servers": source.bootstrap_servers, "linger.ms": 5, **(dl.producer_config or {})}
        self.txn_id = f"{dl.transactional_id_prefix}-{subtask}"
        self.what = f"KafkaSource dead letters to {dl.topic!r} (transactional id {self.txn_id!r})"
        self.producer = ck.Producer({**conf, "transactional.id": self.txn_id})
        self.markers = ck.Consumer({
            **{k: v for k, v in conf.items() if k not in _PRODUCER_ONLY},
            "group.id": f"{dl.transactional_id_prefix}-dead-letters",
            "enable.auto.commit": False,
        })  # fmt: skip
        try:
            md = list_topics(self.markers, source.bootstrap_servers, self.what)
            tm = md.topics.get(dl.topic)
            if tm is None or tm.error is not None or not tm.partitions:
                raise KafkaError(f"dead-letter topic {dl.topic!r} does not exist on {source.bootstrap_servers}"
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


# -- sink ----------------------------------------------------------------------------------------


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
        self.producer_config = _check_config("KafkaSink producer_config", producer_config)
        self.pool_size = pool_size

    def __repr__(self) -> str:
        return f"KafkaSink({self.bootstrap_servers!r}, {self.topic!r}, delivery={self.delivery!r})"

    def create_operator(self, uid: str) -> StreamOperator:
        _kafka()
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
        ck = _kafka()
        self.ck = ck
        sink = self.sink
        self.vser = sink.value_serializer or _json_bytes
        self.kser = sink.key_serializer
        # the cluster answers: checked as the source checks it (same timeout, same words)
        list_topics(ck.admin.AdminClient(sink.config()), sink.bootstrap_servers, f"KafkaSink {self.uid}")
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
        """A producer call that may serve delivery callbacks: its failure as a KafkaError."""
        return kafka_call(f"KafkaSink {self.uid} ({self.sink.topic!r}): {what}", fn, *args, **kwargs)

    def _marker_consumer(self, subtask: int) -> Any:
        c = self.markers.get(subtask)
        if c is None:
            c = self.markers[subtask] = self.ck.Consumer({
                **{k: v for k, v in self.sink.config().items() if k not in _PRODUCER_ONLY},
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
            if hasattr(self, "producer"):
                try:
                    self._call("flush", self.producer.flush, 5)
                except KafkaError as e:  # closing after a failure: that failure is the error
                    log.warning("%s", e)
            return
        # open and pre-committed transactions stay as they are: the next attempt decides
        for c in self.__dict__.get("markers", {}).values():
            c.close()
