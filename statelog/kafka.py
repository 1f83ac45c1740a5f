"""Kafka offsets in checkpoints for a user's own consumer loop (no runtime needed).

A consumer loop with statelog state is exactly once with respect to its state when it
resumes from the offsets recorded in the checkpoint it restored: the state at checkpoint n
is the state after the records before n's offsets, so the records after them are replayed
once. :class:`KafkaOffsets` does the two halves::

    job = statelog.open(root)
    last = job.latest_checkpoint()
    backend = job.backend("counter", restore=last)            # state at checkpoint `last`
    offsets = KafkaOffsets({"bootstrap.servers": ..., "group.id": ...}, ["clicks"])
    consumer = offsets.consumer                               # or pass a Consumer of your own
    offsets.restore(last)                                     # assign + seek to last's offsets
    while True:
        msg = consumer.poll(1.0)
        ...                                                   # update state from msg
        if due:
            offsets.checkpoint(job)                           # job.checkpoint(sources=positions)

* **What is recorded.** ``sources[topic] = {partition: next offset}`` for every assigned
  partition: ``int`` partition numbers and ``int`` offsets (checkpoint metadata keeps their
  types, format version 3, ``docs/format.md``). The next offset is ``Consumer.position()``:
  one past the last record ``poll``/``consume`` returned, so a checkpoint must be taken
  between records, after the whole of a ``consume()`` batch has been applied to the state.
  A partition nothing was read from since :meth:`KafkaOffsets.restore` keeps its start offset.
* **Restore.** The partitions to read are assigned (``Consumer.assign``, never ``subscribe``:
  a group rebalance would move partitions away from their state) at the checkpoint's offsets;
  a partition the checkpoint does not name (a fresh job, or a partition added since) starts at
  ``start``: ``"earliest"``, ``"latest"`` or a timestamp in ms (``offsets_for_times``),
  resolved to a concrete offset at once so that every checkpoint holds concrete offsets.
  Checkpoints written before version 3 hold partitions as strings (``{"0": 5}``); they are
  read as ints.
* **Errors.** A cluster that does not answer within ``timeout_s`` is a :class:`ConfigError`
  naming the bootstrap address when :class:`KafkaOffsets` made the consumer from its settings
  ("is the broker reachable?"). The loop deserializes its records itself: what it does with
  one it cannot read (fail naming ``msg.topic()``, ``msg.partition()``, ``msg.offset()``, or
  produce it to a dead-letter topic, ``docs/kafka.md``) is its own.
* **Several processes.** One job root has one checkpoint publisher (the writer lease,
  ``statelog/checkpoint/writer_lease.py``): a second process opening the same root is refused with
  :class:`~statelog.errors.LeaseHeldError`. To share a topic's partitions between processes
  give each process its own root and a fixed set of ``partitions`` (``docs/kafka.md``).

The consumer's committed group offsets are never the truth; commit them after a checkpoint
for monitoring if wanted (``commit_offsets=True``). ``confluent-kafka`` is the ``kafka``
extra (``pip install 'statelog[kafka]'``); this module imports without it and raises
:class:`~statelog.errors.MissingDependencyError` when used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError, MissingDependencyError

try:  # the kafka extra; statelog imports without it
    from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition
except ImportError:  # pragma: no cover - exercised only without the extra
    TopicPartition = None
    OFFSET_INVALID = -1001
    Consumer = None

    class KafkaException(Exception):  # type: ignore[no-redef]  # noqa: N818 - confluent-kafka's name
        """Never raised: confluent-kafka is not installed."""

if TYPE_CHECKING:
    from statelog.job import StateJob

log = logging.getLogger(__name__)

Positions = dict[str, dict[int, int]]  # topic -> partition -> next offset to read


def _require_client() -> None:
    if TopicPartition is None:
        raise MissingDependencyError(
            "statelog.kafka needs confluent-kafka, which is not installed: "
            "pip install 'statelog[kafka]' (or pip install confluent-kafka)"
        )


def _check_start(start: str | int) -> str | int:
    if start in ("earliest", "latest"):
        return start
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return start
    raise ConfigError(
        f"start={start!r}: expected 'earliest', 'latest' or a timestamp in milliseconds (int >= 0)"
    )


def _check_topics(topics: str | Sequence[str]) -> list[str]:
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ConfigError(f"topics={topics!r}: expected a topic name or a non-empty list of them")
    if len(set(names)) != len(names):
        raise ConfigError(f"topics={topics!r} names a topic twice")
    return names


def _partition_number(value: Any, where: str) -> int:
    """An int partition number; digit strings are the partitions of pre-v3 checkpoints."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ConfigError(f"{where}: partition {value!r} is not a partition number (int >= 0)")


def checkpoint_positions(
    checkpoint: CheckpointMetadata | None, topics: str | Sequence[str]
) -> Positions:
    """The Kafka offsets ``checkpoint`` recorded for ``topics`` (``{}`` for a topic it lacks).

    Raises :class:`ConfigError` when a topic's entry is not ``{partition: offset}``.
    """
    out: Positions = {}
    if checkpoint is None:
        return {t: {} for t in _check_topics(topics)}
    for topic in _check_topics(topics):
        entry = checkpoint.sources.get(topic)
        where = f"checkpoint {checkpoint.checkpoint_id} sources[{topic!r}]"
        if entry is None:
            out[topic] = {}
            continue
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{where} is {entry!r}, expected Kafka offsets {{partition: offset}}; was this "
                "checkpoint written by a loop with another source of that name?"
            )
        positions: dict[int, int] = {}
        for key, offset in entry.items():
            partition = _partition_number(key, where)
            if not (isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0):
                raise ConfigError(f"{where}[{key!r}] is {offset!r}, expected an offset (int >= 0)")
            positions[partition] = offset
        out[topic] = positions
    return out


class KafkaOffsets:
    """The Kafka positions of one ``confluent_kafka.Consumer`` for statelog checkpoints.

    ``consumer``: the loop's ``Consumer``, or its settings (a dict with ``bootstrap.servers``
    and ``group.id``): then this makes the consumer (``enable.auto.commit`` false unless
    given), :attr:`consumer`, and its errors name the bootstrap address (a ``Consumer`` does
    not tell its settings). When the cluster does not answer within ``timeout_s`` the calls
    that ask it raise :class:`ConfigError` ("is the broker reachable?").
    ``topics``: the topics this loop reads (each one a source of the checkpoint, by name).
    ``partitions``: ``{topic: [partition, ...]}`` this process owns; every partition of a
    topic that is not in the mapping (all partitions when ``None``). ``start``: where a
    partition the restored checkpoint does not name begins (module docstring).
    """

    def __init__(
        self,
        consumer: Any,
        topics: str | Sequence[str],
        *,
        partitions: Mapping[str, Iterable[int]] | None = None,
        start: str | int = "earliest",
        timeout_s: float = 10.0,
    ) -> None:
        _require_client()
        self.topics = _check_topics(topics)
        self.start = _check_start(start)
        self.timeout_s = float(timeout_s)
        self._owned: dict[str, list[int]] | None = None
        self._partitions_arg: dict[str, list[int]] = {}
        for topic, parts in (partitions or {}).items():
            if topic not in self.topics:
                raise ConfigError(
                    f"partitions names topic {topic!r}, which is not in topics {self.topics}"
                )
            numbers = sorted({_partition_number(p, f"partitions[{topic!r}]") for p in parts})
            if not numbers:
                raise ConfigError(
                    f"partitions[{topic!r}] is empty; leave the topic out to read all of it"
                )
            self._partitions_arg[topic] = numbers
        self._start_offsets: Positions = {}
        self.bootstrap_servers: str | None = None
        if isinstance(consumer, Mapping):
            conf = {"enable.auto.commit": False, **consumer}
            self.bootstrap_servers = conf.get("bootstrap.servers")
            try:
                consumer = Consumer(conf)
            except (KafkaException, TypeError, ValueError) as e:
                text = str(e)
                for key, value in conf.items():  # a refused secret is not repeated
                    if any(w in key.lower() for w in ("password", "secret", "token", "key")):
                        text = text.replace(str(value), "***")
                raise ConfigError(f"the consumer settings were refused: {text}") from None
        self.consumer = consumer

    def _ask(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, a call that asks the cluster: a :class:`ConfigError` naming
        the bootstrap address (``<where>`` in ``what``) when it does not answer."""
        try:
            return fn(*args, **kwargs)
        except KafkaException as e:
            where = self.bootstrap_servers or "the cluster of the consumer's bootstrap.servers"
            raise ConfigError(
                f"KafkaOffsets could not {what.replace('<where>', where)} ({e}); "
                "is the broker reachable?"
            ) from None

    # -- restore ---------------------------------------------------------------------------

    def restore(self, checkpoint: CheckpointMetadata | None) -> Positions:
        """Assign the consumer to this loop's partitions at ``checkpoint``'s offsets (``None``:
        a fresh start) and return the offsets it starts from."""
        recorded = checkpoint_positions(checkpoint, self.topics)
        owned = self._owned_partitions()
        start: Positions = {}
        for topic, parts in owned.items():
            start[topic] = {}
            missing = sorted(set(recorded[topic]) - set(self._all_partitions(topic)))
            if missing:
                raise ConfigError(
                    f"checkpoint {checkpoint.checkpoint_id if checkpoint else '-'} records offsets "
                    f"of partitions {missing} of topic {topic!r}, which has only partitions "
                    f"{self._all_partitions(topic)}: is this the topic the job was reading?"
                )
            fresh = [p for p in parts if p not in recorded[topic]]
            for p in parts:
                if p in recorded[topic]:
                    start[topic][p] = self._check_recorded(checkpoint, topic, p, recorded[topic][p])
            start[topic].update(self._resolve_start(topic, fresh))
        self.consumer.assign(
            [
                TopicPartition(t, p, off)
                for t, offs in start.items()
                for p, off in sorted(offs.items())
            ]
        )
        self._start_offsets = start
        log.info(
            "kafka offsets restored from checkpoint %s: %s",
            checkpoint.checkpoint_id if checkpoint else None,
            {t: len(o) for t, o in start.items()},
        )
        return {t: dict(o) for t, o in start.items()}

    def _check_recorded(
        self, checkpoint: CheckpointMetadata | None, topic: str, partition: int, offset: int
    ) -> int:
        """A recorded offset, refused past the partition's end (another topic of that name)
        and reported when retention deleted records the state has not seen yet."""
        low, high = self._watermarks(topic, partition)
        cid = checkpoint.checkpoint_id if checkpoint else None
        if offset > high:
            raise ConfigError(
                f"checkpoint {cid} records offset {offset} for {topic}[{partition}], but the "
                f"partition ends at offset {high}: was the topic deleted and created again? "
                "Restore a checkpoint of this topic, or start the job on a new root"
            )
        if offset < low:
            log.warning(
                "checkpoint %s records offset %d for %s[%d], but the partition now starts at %d: "
                "records %d..%d were deleted (retention) before this job read them; the "
                "consumer's auto.offset.reset decides where it goes on",
                cid, offset, topic, partition, low, offset, low - 1,
            )  # fmt: skip
        return offset

    def _owned_partitions(self) -> dict[str, list[int]]:
        if self._owned is None:
            owned: dict[str, list[int]] = {}
            for topic in self.topics:
                existing = self._all_partitions(topic)
                wanted = self._partitions_arg.get(topic, existing)
                absent = sorted(set(wanted) - set(existing))
                if absent:
                    raise ConfigError(
                        f"partitions {absent} of topic {topic!r} do not exist (it has {existing})"
                    )
                owned[topic] = wanted
            self._owned = owned
        return self._owned

    def _all_partitions(self, topic: str) -> list[int]:
        meta = self._ask(
            "list the topics of <where>", self.consumer.list_topics, topic, timeout=self.timeout_s
        ).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            why = "no metadata" if meta is None else (meta.error or "no partitions")
            raise ConfigError(f"Kafka topic {topic!r} cannot be read: {why}; does it exist?")
        return sorted(meta.partitions)

    def _resolve_start(self, topic: str, parts: list[int]) -> dict[int, int]:
        """Concrete start offsets of partitions no checkpoint names."""
        if not parts:
            return {}
        if isinstance(self.start, int):
            found = self._ask(
                f"look up the offsets of {topic!r} at time {self.start} on <where>",
                self.consumer.offsets_for_times,
                [TopicPartition(topic, p, self.start) for p in parts],
                timeout=self.timeout_s,
            )
            out = {}
            for tp in found:
                if tp.error is not None:
                    raise ConfigError(f"offsets_for_times({topic!r}, {tp.partition}): {tp.error}")
                # no record at or after the time: start at the end
                out[tp.partition] = (
                    tp.offset if tp.offset >= 0 else self._watermarks(topic, tp.partition)[1]
                )
            return out
        index = 0 if self.start == "earliest" else 1
        return {p: self._watermarks(topic, p)[index] for p in parts}

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        low, high = self._ask(
            f"read the first and last offsets of {topic}[{partition}] from <where>",
            self.consumer.get_watermark_offsets,
            TopicPartition(topic, partition),
            timeout=self.timeout_s,
            cached=False,
        )
        return int(low), int(high)

    # -- checkpoint ------------------------------------------------------------------------

    def positions(self) -> Positions:
        """``{topic: {partition: next offset}}`` of every partition :meth:`restore` assigned."""
        if not self._start_offsets:
            raise ConfigError(
                "KafkaOffsets.positions() before restore(): restore assigns the partitions"
            )
        tps = [
            TopicPartition(t, p) for t, offs in self._start_offsets.items() for p in sorted(offs)
        ]
        out: Positions = {t: dict(offs) for t, offs in self._start_offsets.items()}
        for tp in self.consumer.position(tps):
            if tp.error is not None:
                raise ConfigError(
                    f"the consumer has no position for {tp.topic}[{tp.partition}]: {tp.error}"
                )
            if tp.offset != OFFSET_INVALID:  # nothing read since restore: its start offset
                out[tp.topic][tp.partition] = int(tp.offset)
        return out

    def sources(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``sources`` of a checkpoint: :meth:`positions` plus ``extra`` (other sources)."""
        out: dict[str, Any] = dict(self.positions())
        for name, value in (extra or {}).items():
            if name in out:
                raise ConfigError(
                    f"extra source {name!r} has the name of a Kafka topic this loop reads"
                )
            out[name] = value
        return out

    def checkpoint(
        self,
        job: StateJob,
        extra_sources: Mapping[str, Any] | None = None,
        *,
        commit_offsets: bool = False,
        timeout: float = 60.0,
    ) -> CheckpointMetadata:
        """``job.checkpoint(sources=self.sources(extra_sources))``; with ``commit_offsets`` the
        recorded offsets are then committed to the consumer group (monitoring only). The lag of
        each partition goes to ``job.metrics`` (:meth:`report_lag`)."""
        sources = self.sources(extra_sources)
        self.report_lag(job, sources)  # before: the checkpoint's history entry has the lag at its positions
        meta = job.checkpoint(sources=sources, timeout=timeout)
        if commit_offsets:
            self.consumer.commit(
                offsets=[
                    TopicPartition(t, p, off)
                    for t in self.topics
                    for p, off in sorted(sources[t].items())
                ],
                asynchronous=True,
            )
        return meta

    def report_lag(self, job: StateJob, positions: Mapping[str, Any] | None = None) -> None:
        """Tell ``job.metrics`` each partition's lag: the high watermark the consumer last
        fetched (cached by the client, no request) minus ``positions`` (default: the current
        ones). A partition whose high watermark the consumer does not know yet is skipped."""
        positions = positions if positions is not None else self.positions()
        for topic in self.topics:
            for partition, offset in sorted((positions.get(topic) or {}).items()):
                try:
                    _low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                except KafkaException:
                    continue
                if high is not None and high >= 0:
                    job.metrics.kafka_lag(topic, partition, int(high) - int(offset))
