"""The Kafka part of the columnar benchmark: a keyed count from a topic through
:meth:`runtime.Application.run_batches` beside the per-record loop and the client alone.

* **Broker**: ``tests.support.kafka.broker.start_kafka()`` on loopback (as ``bench.kafka``).
* **Input**: ``EVENTS`` records (``quick``: 10^5) over ``KEYS`` keys (``quick``: 10^4),
  key and value the key's decimal ASCII bytes, produced once into a topic of 2 partitions.
* **Runs** (one process each, a fresh ``file://`` root, changelog on, no materializer, a
  checkpoint every second, ``consume()`` of ``BATCH`` messages), interleaved over the rounds:

  - ``kafka_events_per_s``: ``Application.run_batches``, per batch
    ``counts.add_many(batch["key"], ones)`` on a ``ReducingState`` with ``operator.add``;
  - ``kafka_record_events_per_s``: ``Application.run``, per record ``count.update(count.value() + 1)``;
  - ``kafka_consume_only_events_per_s``: a ``Consumer`` reading the topic and reading each
    message's key and value, no state: what the client costs alone.

  events/s = records ÷ the run's wall time (the application's construction to its final
  checkpoint); the reported figure is the median over the rounds, with its spread.
"""

from __future__ import annotations

import contextlib
import operator
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.kafka import produce
from runtime import Application
from statelog import ReducingStateDescriptor, ValueStateDescriptor

EVENTS = 1_000_000
KEYS = 100_000
PARTITIONS = 2
BATCH = 100_000
UID = "bench-count"
RECORD_COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
BATCH_COUNT = ReducingStateDescriptor("count", pa.int64(), reduce_fn=operator.add)


def _app(bootstrap: str, topic: str, root: str) -> Application:
    return Application(root, uid=UID, topics=topic, kafka={"bootstrap.servers": bootstrap}, start="earliest",
                       batch_size=BATCH, checkpoint_interval_s=1.0, materializer=False, handle_signals=False)


def batch_run(bootstrap: str, topic: str, root: str, events: int) -> float:
    t = time.perf_counter()
    app = _app(bootstrap, topic, root)
    counts = app.state(BATCH_COUNT)

    def per_batch(batch: pa.RecordBatch) -> None:
        counts.add_many(batch["key"], pa.array(np.ones(batch.num_rows, dtype=np.int64)))
        if app.records + batch.num_rows >= events:
            app.stop()

    app.run_batches(per_batch)
    return time.perf_counter() - t


def record_run(bootstrap: str, topic: str, root: str, events: int) -> float:
    t = time.perf_counter()
    app = _app(bootstrap, topic, root)
    count = app.state(RECORD_COUNT)
    seen = [0]
    value, update = count.value, count.update

    def per_record(_msg: Any) -> None:
        update(value() + 1)
        seen[0] += 1
        if seen[0] == events:
            app.stop()

    app.run(per_record)
    return time.perf_counter() - t


def consume_only(bootstrap: str, topic: str, events: int) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    t = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        seen = 0
        while seen < events:
            for msg in consumer.consume(BATCH, 0.5):
                if msg.error() is None:
                    msg.key(), msg.value()
                    seen += 1
    finally:
        consumer.close()
    return time.perf_counter() - t


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[columnar/kafka] {msg}", flush=True)


def run(quick: bool = False, progress: bool = True, rounds: int = 3) -> dict[str, Any]:
    from bench.spark_streaming import make_input
    from tests.support.kafka.broker import start_kafka

    events, keys = (100_000, 10_000) if quick else (EVENTS, KEYS)
    work = Path(tempfile.mkdtemp(prefix="statelog-bench-columnar-kafka-"))
    rates: dict[str, list[float]] = {"kafka_consume_only": [], "kafka_record": [], "kafka": []}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        broker = stack.enter_context(start_kafka())
        bootstrap = broker.bootstrap_servers
        make_input(work / "input", events, keys, 4)
        seq = [int(k) for f in sorted((work / "input").glob("input-*.parquet"))
               for k in pq.read_table(f, columns=["key"]).column("key").to_pylist()]  # fmt: skip
        topic = str(broker.create_topic(partitions=PARTITIONS, config={"retention.ms": "-1"}))
        _log(progress, f"{events:,} records produced in {produce(bootstrap, topic, seq):.1f}s")
        del seq
        n = 0
        batch_run(bootstrap, topic, (work / "warm-up").as_uri(), min(events, 10_000))  # imports, first fetch
        for r in range(1 if quick else rounds):
            for kind in rates:
                n += 1
                root = (work / f"root-{n}").as_uri()
                if kind == "kafka":
                    s = batch_run(bootstrap, topic, root, events)
                elif kind == "kafka_record":
                    s = record_run(bootstrap, topic, root, events)
                else:
                    s = consume_only(bootstrap, topic, events)
                rates[kind].append(events / s)
                shutil.rmtree(work / f"root-{n}", ignore_errors=True)
                _log(progress, f"round {r + 1} {kind}: {events / s:,.0f} events/s")
    out: dict[str, Any] = {"kafka_events": events, "kafka_keys": keys, "kafka_batch_size": BATCH}
    for kind, xs in rates.items():
        med = statistics.median(xs)
        out[f"{kind}_events_per_s"] = round(med)
        out[f"{kind}_events_per_s_spread"] = [round(min(xs)), round(max(xs))]
    out["kafka_batch_vs_record"] = round(out["kafka_events_per_s"] / out["kafka_record_events_per_s"], 2)
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv, progress="--json" not in sys.argv)))
