"""The clickstream test job on Kafka: clicks in a topic (partition k holds split k of
``tests/support/jobs.py``'s clicks), per-user tumbling window counts out to a topic.

With a ``gate`` (a file path) the source is paced at ``rate`` only while the file does not
exist and holds back each subtask's last record until it does (as the gated generator of
``tests/support/jobs.py``): a crash loop's job cannot end before its kills landed, and the
rest of its input is read at full speed once the test opens the gate."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from runtime import StreamExecutionEnvironment, TumblingEventTimeWindows, WatermarkStrategy
from runtime.connectors.kafka import KafkaSink, KafkaSource
from runtime.connectors.kafka.reader import KafkaSourceSplits
from runtime.connectors.sources import SourceSplits
from tests.support import jobs


def produce_clicks(broker: Any, topic: str, per_split: int, splits: int = jobs.CLICK_SPLITS) -> None:
    from confluent_kafka import Producer

    p = Producer(broker.config(**{"linger.ms": 20}))
    for k in range(splits):
        for i in range(per_split):
            e = jobs.make_click(k, i)
            p.produce(topic, json.dumps(list(e)).encode(), partition=k)
            if i % 5000 == 0:
                p.poll(0)
    assert p.flush(30) == 0


def read_topic(broker: Any, topic: str, committed: bool = True, timeout_s: float = 30.0) -> list[Any]:
    """Every record of ``topic`` (JSON values), read to the end of every partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(broker.config(**{
        "group.id": "reader", "enable.partition.eof": True, "enable.auto.commit": False,
        "isolation.level": "read_committed" if committed else "read_uncommitted",
    }))  # fmt: skip
    try:
        md = c.list_topics(topic, timeout=10)
        parts = list(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        eof: set[int] = set()
        import time

        deadline = time.monotonic() + timeout_s
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise RuntimeError(str(m.error()))
                eof.discard(m.partition())
                out.append(json.loads(m.value()))
        assert len(eof) == len(parts), f"did not reach the end of {topic} within {timeout_s}s"
        return out
    finally:
        c.close()


def clicks_env(root_url: str, **kw: Any) -> StreamExecutionEnvironment:
    from runtime import FixedDelay

    opts: dict[str, Any] = {
        "parallelism": 2,
        "checkpoint_interval_s": 0.2,
        "checkpoint_timeout_s": 30.0,
        "state_root": root_url,
        "restart_strategy": FixedDelay(attempts=40, delay_s=0.0),
    }
    opts.update(kw)
    return StreamExecutionEnvironment(**opts)


class GatedKafkaSource(KafkaSource):
    """:class:`KafkaSource` of bounded partitions, paced at ``rate`` records/s per subtask while
    the file ``gate`` does not exist, its last record held back until it does."""

    def __init__(self, *args: Any, rate: float, gate: Path, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rate, self.gate = rate, str(gate)

    def open_splits(self, assigned: dict[str, dict[str, Any] | None], watermarks: WatermarkStrategy | None, *,
                    subtask: int = 0, parallelism: int = 1, restored: bool = False) -> SourceSplits:
        return _GatedKafkaSplits(self, assigned, watermarks, subtask, parallelism, restored)


class _GatedKafkaSplits(KafkaSourceSplits):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.t0: float | None = None  # the pace counts from the first read (after the restore)
        self.taken, self.open = 0, False

    def read(self, max_records: int) -> list[tuple[Any, int | None]]:
        if not self.open:
            self.open = os.path.exists(self.source.gate)
        if not self.open:
            if self.t0 is None:
                self.t0 = time.monotonic()
            left = sum(p.stop - p.next for p in self.parts.values() if p.stop is not None and p.next is not None)
            allowed = int(self.source.rate * (time.monotonic() - self.t0)) - self.taken
            max_records = min(max_records, allowed, left - 1)
            if max_records <= 0:
                return []
        out = super().read(max_records)
        self.taken += len(out)
        return out


def build_kafka_clicks(
    env: StreamExecutionEnvironment,
    bootstrap: str,
    topic_in: str,
    topic_out: str,
    *,
    delivery: str = "exactly-once",
    prefix: str = "clicks",
    rate: float | None = None,
    gate: Path | None = None,
) -> None:
    source = (
        KafkaSource(bootstrap, topic_in, bounded=True, value_deserializer=json.loads, records_per_s=rate,
                    discovery_interval_s=None) if gate is None else
        GatedKafkaSource(bootstrap, topic_in, bounded=True, value_deserializer=json.loads, discovery_interval_s=None,
                         rate=rate or 0.0, gate=gate)
    )  # fmt: skip
    clicks = env.from_source(
        source,
        uid="clicks",
        watermarks=WatermarkStrategy(jobs.click_ts, jobs.OOO_MS),
    )
    (
        clicks.key_by(jobs.click_user)
        .window(TumblingEventTimeWindows(jobs.WINDOW_MS))
        .aggregate(jobs.CountClicks(), uid="window-count", window_function=jobs.window_row)
        .sink_to(KafkaSink(bootstrap, topic_out, delivery=delivery, transactional_id_prefix=prefix), uid="out")
    )
