"""The clickstream job from a Kafka topic to a Kafka topic, exactly once, with a worker killed.

``python -m examples.kafka_clicks [--bootstrap HOST:PORT]`` (without ``--bootstrap`` it
starts the test broker, noida-db from the dev dependencies, on loopback). The exit code is
0 only if every check passes. ``docs/kafka.md`` describes the connectors.

1. **Input**: ``--events`` clicks ``{"user", "page", "ts"}`` (JSON) produced to a new topic
   ``clicks-<run>`` with ``--partitions`` partitions, deterministic from ``--seed``.
2. **Job** (parallelism 2, aligned checkpoints every second): ``KafkaSource`` (uid
   ``clicks``, bounded at the end offsets it finds, paced) -> ``key_by(user)`` -> 10 s
   tumbling event-time windows counting clicks (uid ``clicks-per-window``) -> ``KafkaSink``
   (uid ``windows-out``, ``delivery="exactly-once"``) into ``windows-<run>``:
   ``[user, window start, clicks]``.
3. **Failure**: once a checkpoint completed, one worker process is SIGKILLed; the job
   restarts from the latest checkpoint (offsets rewound, open transactions aborted).
4. **Check**: a ``read_committed`` consumer of the output topic sees exactly the window
   counts computed from the input in plain Python, each once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from typing import Any

from runtime import (
    FixedDelay,
    StreamExecutionEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from runtime.connectors.kafka import KafkaSink, KafkaSource

EPOCH_MS = 1_735_689_600_000
STEP_MS = 4
OUT_OF_ORDERNESS_MS = 2_000
WINDOW_MS = 10_000
PAGES = ("/", "/search", "/cart", "/checkout", "/help")


def clicks(events: int, users: int, partitions: int, seed: int) -> list[list[dict[str, Any]]]:
    """The clicks of each partition, in order (event times lag by less than 2 s)."""
    out = []
    for k in range(partitions):
        rng = random.Random(f"{seed}:{k}")
        n = events // partitions + (1 if k < events % partitions else 0)
        out.append([{"user": f"u{min(int(rng.paretovariate(1.2)), users) - 1:05d}", "page": rng.choice(PAGES),
                     "ts": EPOCH_MS + i * STEP_MS - rng.randrange(OUT_OF_ORDERNESS_MS)} for i in range(n)])  # fmt: skip
    return out


def golden(parts: list[list[dict[str, Any]]]) -> list[list[Any]]:
    c: Counter[tuple[str, int]] = Counter()
    for part in parts:
        for e in part:
            c[(e["user"], e["ts"] - e["ts"] % WINDOW_MS)] += 1
    return sorted([u, s, n] for (u, s), n in c.items())


def click_ts(e: dict[str, Any]) -> int:
    return e["ts"]


def click_user(e: dict[str, Any]) -> str:
    return e["user"]


class CountClicks:
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, acc: int) -> int:
        return acc + 1

    def get_result(self, acc: int) -> int:
        return acc


def window_row(user: str, window: Any, n: int) -> list[Any]:
    return [user, window.start, n]


def read_committed_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "enable.auto.commit": False})  # fmt: skip
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        eof: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {topic}: {m.error()}")
                    eof.add(m.partition())
                    continue
                eof.discard(m.partition())
                out.append(json.loads(m.value()))
        return out
    finally:
        c.close()


def run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    run_id = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"clicks-{run_id}", f"windows-{run_id}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic_in, args.partitions), NewTopic(topic_out, 2)]).values():
        f.result(30)
    parts = clicks(args.events, args.users, args.partitions, args.seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for k, part in enumerate(parts):
        for e in part:
            while True:
                try:
                    producer.produce(topic_in, json.dumps(e).encode(), partition=k)
                    break
                except BufferError:
                    producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError(f"could not produce the input to {topic_in}")

    root = args.root or f"file://{tempfile.mkdtemp(prefix='kafka-clicks-')}"
    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=1.0, state_root=root,
                                     restart_strategy=FixedDelay(attempts=5, delay_s=0.2))  # fmt: skip
    source = KafkaSource(bootstrap, topic_in, bounded=True, value_deserializer=json.loads,
                         records_per_s=args.rate or None)  # fmt: skip
    (
        env.from_source(source, uid="clicks", watermarks=WatermarkStrategy(click_ts, OUT_OF_ORDERNESS_MS))
        .key_by(click_user)
        .window(TumblingEventTimeWindows(WINDOW_MS))
        .aggregate(CountClicks(), uid="clicks-per-window", window_function=window_row)
        .sink_to(KafkaSink(bootstrap, topic_out, delivery="exactly-once", transactional_id_prefix=f"kafka-clicks-{run_id}"),
                 uid="windows-out")  # fmt: skip
    )
    t0 = time.monotonic()
    client = env.execute_async("kafka-clicks")
    killed = None
    deadline = time.monotonic() + 120
    while not client.done and time.monotonic() < deadline:  # kill a worker once a checkpoint completed
        if client.completed_checkpoints and client.worker_pids():
            killed = random.Random(args.seed).choice(client.worker_pids())
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.1)
    result = client.wait(300)
    out = read_committed_topic(bootstrap, topic_out)
    want = golden(parts)
    return {
        "bootstrap": bootstrap,
        "input_topic": topic_in,
        "output_topic": topic_out,
        "state_root": root,
        "events": args.events,
        "killed_worker_pid": killed,
        "attempts": result.attempts,
        "checkpoints": len(result.completed_checkpoints),
        "duration_s": round(time.monotonic() - t0, 2),
        "output_records": len(out),
        "expected_records": len(want),
        "duplicates": len(out) - len({tuple(r) for r in out}),
        "exactly_once": sorted(out) == want,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.kafka_clicks", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: start the test broker on loopback)")
    p.add_argument("--root", help="the job root URL (default: a fresh file:// directory)")
    p.add_argument("--events", type=int, default=100_000, help="number of clicks (default 100000)")
    p.add_argument("--users", type=int, default=2_000, help="number of users (default 2000)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the input topic (default 4)")
    p.add_argument("--rate", type=float, default=4_000, help="clicks/s per source subtask (default 4000; 0: unpaced)")
    p.add_argument("--seed", type=int, default=7, help="seed of the input and of the kill (default 7)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    args = p.parse_args(argv)
    for name in ("events", "users", "partitions"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.rate < 0:
        p.error("--rate must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from tests.support.kafka.broker import start_kafka  # the dev dependencies' noida-db

        broker = start_kafka()
        bootstrap = broker.bootstrap_servers
    try:
        report = run(args, bootstrap)
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        for k, v in report.items():
            sys.stdout.write(f"{k:>18}: {v}\n")
    return 0 if report["exactly_once"] and report["killed_worker_pid"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
