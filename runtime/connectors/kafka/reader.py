"""The reading side of a Kafka source subtask: all its partitions read by one consumer,
with per-partition offsets, stops (bounded), watermarks and partition discovery."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from runtime.api.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.connectors.kafka.client import KafkaError, require_kafka
from runtime.connectors.kafka.dead_letter import DeadLetter, DeadLetterProducer
from runtime.connectors.kafka.records import (
    COMMITTED,
    EARLIEST,
    LATEST,
    RECORD_TIMESTAMP,
    KafkaRecord,
    parse_split,
    split_id,
)
from runtime.connectors.sources import SourceSplits, WatermarkStrategy, records_to_batch
from statelog.restore.collector import gc_paused

log = logging.getLogger(__name__)

EMPTY_READS_AT_END = 5  # empty polls (10 ms each) after EOF at the stop offset: a bounded partition ended


class KafkaSourceSettings(Protocol):
    """What the reading side uses of its :class:`~runtime.connectors.kafka.source.KafkaSource`
    (which creates it, so this module does not import that one)."""

    bootstrap_servers: str
    starting_offsets: str | int
    bounded: bool
    key_deserializer: Callable[[bytes | None], Any] | None
    value_deserializer: Callable[[bytes | None], Any] | None
    emit: str
    idle_timeout_ms: int | None
    discovery_interval_s: float | None
    commit_offsets: bool
    on_error: str | DeadLetter
    metadata_timeout_s: float

    def config(self) -> dict[str, Any]: ...

    def list_partitions(self, client: Any, timeout: float | None = None) -> list[tuple[str, int]]: ...


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
        source: KafkaSourceSettings,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
        subtask: int,
        parallelism: int,
        restored: bool,
    ) -> None:
        ck = require_kafka()
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
        self.dead_letters: DeadLetterProducer | None = None
        if isinstance(source.on_error, DeadLetter):
            try:
                self.dead_letters = DeadLetterProducer(source.bootstrap_servers, source.on_error, subtask,
                                                       metadata_timeout_s=source.metadata_timeout_s)
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
        # the cyclic collector paused while the client builds its Message objects and they are
        # turned into records (as runtime.Application does: they set off collections that
        # traverse the batch again and again)
        with gc_paused():
            return self._read(max_records)

    def _read(self, max_records: int) -> list[tuple[Any, int | None]]:
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

    def read_batch(self, max_records: int) -> list[tuple[Any, None]]:
        """``batches=True``: the records of one :meth:`read` as one record batch."""
        batch = records_to_batch([v for v, _ts in self.read(max_records)])
        return [] if batch is None else [(batch, None)]

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

