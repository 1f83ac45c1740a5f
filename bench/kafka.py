"""Kafka benchmark: a keyed count read from a Kafka topic, on the runtime with the
exactly-once and the ``delivery="none"`` Kafka sink, the same job from Parquet files, and a
plain ``confluent_kafka.Consumer`` loop with statelog state (``statelog.kafka.KafkaOffsets``).

* **Broker**: ``tests.support.kafka.broker.start_kafka()`` (noida-db on loopback, the test broker;
  this benchmark imports from ``tests`` as ``bench.recovery`` does) unless ``--bootstrap
  HOST:PORT`` names one. The broker runs on the same machine as the job.
* **Input**: ``EVENTS`` records (``--quick``: 10^5) over ``KEYS`` keys (uniform, shuffled:
  ``bench.spark_streaming.make_input``), produced once into a topic of ``PARTITIONS``
  partitions by one producer with batching (``linger.ms``): key and value are the key's
  decimal ASCII bytes, partitioned by the producer's key hash. The same events are written as
  Parquet files (``FILES`` files, ``key int64``).
* **Runtime job** (parallelism 2, changelog backend, checkpoint every second, ``file://`` root
  in a temporary directory): ``source -> key_by(key) -> count -> KafkaSink`` where ``count``
  keeps a ``ValueState<int64>`` per key and emits ``[key, count]`` for every event (an
  update stream: as many output records as input records), the sink writing JSON to a fresh
  output topic of ``PARTITIONS`` partitions. Variants:

  - ``kafka_exactly_once``: ``KafkaSource(bounded=True, value_deserializer=int)`` and
    ``KafkaSink(delivery="exactly-once")`` (a transaction per subtask and checkpoint);
  - ``kafka_none``: the same source, ``KafkaSink(delivery="none")``;
  - ``parquet_none``: ``ParquetSource(row="tuple")`` over the Parquet files, ``delivery="none"``
    (what reading from Kafka costs compared with files).

  events/s = input records ÷ the job's wall time (``JobResult.duration_s``: workers started,
  input read to its end, final checkpoint, which commits the exactly-once transactions).
* **Consumer loop** (``consumer_loop``): one process, one ``Consumer``
  (``read_committed``, no auto commit) over all partitions; ``consume(BATCH)`` batches, each
  record ``set_current_key(key) ; count += 1`` on a statelog changelog backend; after a batch,
  once ``CHECKPOINT_EVERY`` records have been applied since the last one,
  ``KafkaOffsets.checkpoint(job)``; a last checkpoint at the end. No output topic. events/s
  = records ÷ wall time from the consumer's creation to the last checkpoint.
* **Rounds**: one warm-up runtime job (not counted: it starts the forkserver), then ``ROUNDS``
  rounds of the four variants, interleaved; the median counts, ``spread`` = (max - min) ÷
  median.
* **Checks**: every runtime run restores its final checkpoint and the consumer loop its last
  one; the total count must equal the input size, or the benchmark aborts.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import statelog
from runtime import KeyedProcessFunction, ParquetSource, StreamExecutionEnvironment
from statelog import ValueStateDescriptor

EVENTS = 1_000_000
KEYS = 100_000
PARTITIONS = 2
FILES = 4
ROUNDS = 2
CHECKPOINT_EVERY = 100_000
BATCH = 1_000
UID = "count"
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def first(e: tuple[Any, ...]) -> Any:
    return e[0]


def identity(e: Any) -> Any:
    return e


class CountPerKey(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, e: Any, ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        yield [ctx.current_key, n]


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def produce(bootstrap: str, topic: str, keys: list[int]) -> float:
    """Produce the input; returns the seconds it took."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 500_000, "compression.type": "none"})  # fmt: skip
    t = time.perf_counter()
    for k in keys:
        b = str(k).encode()
        while True:
            try:
                p.produce(topic, value=b, key=b)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) != 0:
        raise RuntimeError("input producer: records left unsent after 120 s")
    return time.perf_counter() - t


def run_job(kind: str, bootstrap: str, topic: str, out_topic: str, parquet_dir: Path, root: str) -> Any:
    from runtime.connectors.kafka import KafkaSink, KafkaSource

    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=1.0, checkpoint_timeout_s=120.0,
                                     state_root=root, state_backend="changelog")  # fmt: skip
    if kind == "parquet_none":
        events = env.from_source(ParquetSource(parquet_dir, "input-*.parquet", columns=["key"], row="tuple"),
                                 uid="events")  # fmt: skip
        keyed = events.key_by(first)
    else:
        src = KafkaSource(bootstrap, topic, bounded=True, value_deserializer=int, discovery_interval_s=None,
                          group_id=f"bench-{uuid.uuid4().hex[:8]}")  # fmt: skip
        keyed = env.from_source(src, uid="events").key_by(identity)
    delivery = "exactly-once" if kind == "kafka_exactly_once" else "none"
    sink = KafkaSink(bootstrap, out_topic, delivery=delivery,
                     transactional_id_prefix=f"bench-{uuid.uuid4().hex[:8]}" if delivery == "exactly-once" else None)
    keyed.process(CountPerKey(), uid=UID).sink_to(sink, uid="out")
    return env.execute(f"bench-kafka-{kind}")


def total_count(root: str, checkpoint_id: Any, parallelism: int) -> int:
    with statelog.open(root, create=False) as job:
        total = 0
        for i in range(parallelism):
            b = job.backend(UID, subtask=i, parallelism=parallelism, restore=checkpoint_id, changelog=False)
            b.get_state(COUNT)
            total += sum(v for _, _, v in b.entries("count"))
            b.close()
        return total


def consumer_loop(bootstrap: str, topic: str, root: str, events: int) -> tuple[float, int]:
    """Returns (seconds, checkpoints)."""
    from confluent_kafka import Consumer

    from statelog.kafka import KafkaOffsets

    t = time.perf_counter()
    checkpoints = 0
    with statelog.open(root) as job:
        backend = job.backend(UID, restore="none")
        counts = backend.get_state(COUNT)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
        try:
            offsets = KafkaOffsets(consumer, [topic], start="earliest")
            offsets.restore(None)
            seen = since = 0
            set_key, value, update = backend.set_current_key, counts.value, counts.update
            while seen < events:
                for msg in consumer.consume(BATCH, 0.5):
                    if msg.error():
                        continue
                    set_key(int(msg.key()))
                    update(value() + 1)
                    seen += 1
                    since += 1
                if since >= CHECKPOINT_EVERY:
                    offsets.checkpoint(job)
                    checkpoints += 1
                    since = 0
            meta = offsets.checkpoint(job)
            checkpoints += 1
            elapsed = time.perf_counter() - t
        finally:
            consumer.close()
        backend.close()
    with statelog.open(root, create=False) as job:
        b = job.backend(UID, restore=meta.checkpoint_id, changelog=False)
        b.get_state(COUNT)
        got = sum(v for _, _, v in b.entries("count"))
        b.close()
    if got != events:
        raise RuntimeError(f"consumer loop: the last checkpoint counts {got} records, not {events}")
    return elapsed, checkpoints


def run(quick: bool = False, root: str | None = None, progress: bool = True,
        bootstrap: str | None = None) -> dict[str, Any]:  # fmt: skip
    from bench.spark_streaming import make_input

    events = 100_000 if quick else EVENTS
    keys = 10_000 if quick else KEYS
    if root is not None:
        raise SystemExit("bench kafka uses fresh temporary roots (file://); --root is not supported")
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-kafka-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        if bootstrap is None:
            from tests.support.kafka.broker import start_kafka

            broker = stack.enter_context(start_kafka())
            bootstrap = broker.bootstrap_servers

            def create_topic() -> str:
                return str(broker.create_topic(partitions=PARTITIONS, config={"retention.ms": "-1"}))
        else:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": bootstrap})

            def create_topic() -> str:
                name = f"bench-{uuid.uuid4().hex}"
                for f in admin.create_topics([NewTopic(name, PARTITIONS, 1)]).values():
                    f.result(30)
                time.sleep(1.0)
                return name

        parquet_dir = work / "input"
        make_input(parquet_dir, events, keys, FILES)
        seq = [int(k) for f in sorted(parquet_dir.glob("input-*.parquet"))
               for k in pq.read_table(f, columns=["key"]).column("key").to_pylist()]  # fmt: skip
        topic = create_topic()
        produce_s = produce(bootstrap, topic, seq)
        del seq
        _log(progress, f"{events:,} records produced into {topic} in {produce_s:.1f}s")

        kinds = ("kafka_exactly_once", "kafka_none", "parquet_none")
        rates: dict[str, list[float]] = {k: [] for k in (*kinds, "consumer_loop")}
        checkpoints: dict[str, list[int]] = {k: [] for k in rates}
        n = 0

        def one(kind: str) -> tuple[float, int]:
            nonlocal n
            n += 1
            rdir = work / f"root-{n}"
            try:
                if kind == "consumer_loop":
                    s, c = consumer_loop(bootstrap, topic, rdir.as_uri(), events)
                    return events / s, c
                res = run_job(kind, bootstrap, topic, create_topic(), parquet_dir, rdir.as_uri())
                got = total_count(rdir.as_uri(), res.final_checkpoint, 2)
                if got != events:
                    raise RuntimeError(f"{kind}: the final checkpoint counts {got} records, not {events}")
                return events / res.duration_s, len(res.completed_checkpoints)
            finally:
                shutil.rmtree(rdir, ignore_errors=True)

        t = time.perf_counter()
        one("kafka_none")
        _log(progress, f"warm-up run in {time.perf_counter() - t:.1f}s")
        rounds = 1 if quick else ROUNDS
        for r in range(rounds):
            for kind in rates:
                rate, c = one(kind)
                rates[kind].append(rate)
                checkpoints[kind].append(c)
                _log(progress, f"round {r + 1} {kind}: {rate:,.0f} events/s ({events / rate:.2f}s, {c} checkpoints)")

    med = {k: statistics.median(v) for k, v in rates.items()}
    out: dict[str, Any] = {"events": events, "keys": keys, "partitions": PARTITIONS, "rounds": rounds,
                           "quick": quick, "produce_s": round(produce_s, 2),
                           "consumer_loop_checkpoint_every": CHECKPOINT_EVERY}  # fmt: skip
    for k in rates:
        out[f"events_per_s_{k}"] = round(med[k])
        out[f"spread_{k}"] = round((max(rates[k]) - min(rates[k])) / med[k], 3)
        out[f"checkpoints_per_run_{k}"] = checkpoints[k]
    out["exactly_once_vs_none"] = round(med["kafka_exactly_once"] / med["kafka_none"], 3)
    out["kafka_none_vs_parquet_none"] = round(med["kafka_none"] / med["parquet_none"], 3)
    return out
