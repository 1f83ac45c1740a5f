"""Crash loop, Kafka in -> Kafka out: at least 20 worker SIGKILLs while the clickstream job
reads a topic and writes window counts to a topic.

* exactly-once (transactions): a ``read_committed`` reader sees exactly the golden output;
* at-least-once: nothing is lost (duplicates are counted, not forbidden).
"""

from __future__ import annotations

import os
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.support import jobs
from tests.support.chaos import kill_workers
from tests.support.jobs import open_gate
from tests.support.kafka.jobs import build_kafka_clicks, clicks_env, produce_clicks, read_topic
from tests.support.s3server import RootSpec

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.fault]

# the suite's loops are short; STATELOG_LONG_LOOPS=1 runs the longer ones (20 kills)
KILLS = 20 if os.environ.get("STATELOG_LONG_LOOPS") == "1" else 8
PER_SPLIT = 5000
RATE = 250  # records/s per source subtask while the kills land (the gate holds the end back)


def run_with_kills(kafka_broker, root: RootSpec, delivery: str, seed: int, gate: Path) -> tuple[list, object, object]:
    tin = kafka_broker.create_topic(partitions=jobs.CLICK_SPLITS)
    tout = kafka_broker.create_topic(partitions=2)
    produce_clicks(kafka_broker, tin, PER_SPLIT)
    env = clicks_env(root.url, checkpoint_interval_s=0.2)
    build_kafka_clicks(env, kafka_broker.bootstrap_servers, tin, tout, delivery=delivery,
                       prefix=f"crash-{uuid.uuid4().hex[:8]}", rate=RATE, gate=gate)  # fmt: skip
    client = env.execute_async(f"kafka-crash-{delivery}")
    kills = kill_workers(client, KILLS, random.Random(seed), min_delay_s=0.3, max_delay_s=0.9)
    open_gate(gate)  # the rest of the input at full speed
    result = client.wait(300)
    return read_topic(kafka_broker, tout), kills, result


def test_exactly_once_survives_worker_kills(kafka_broker, file_root: RootSpec, tmp_path: Path) -> None:
    out, kills, result = run_with_kills(kafka_broker, file_root, "exactly-once", 16, tmp_path / "gate")
    assert sorted(out) == jobs.golden_windows(PER_SPLIT)
    assert kills.count >= KILLS, kills
    assert kills.after_checkpoint >= KILLS // 2, kills
    assert result.attempts == kills.count + 1, result.failures


def test_at_least_once_loses_nothing_under_worker_kills(kafka_broker, file_root: RootSpec, tmp_path: Path) -> None:
    out, kills, result = run_with_kills(kafka_broker, file_root, "at-least-once", 61, tmp_path / "gate")
    assert kills.count >= KILLS, kills
    golden = jobs.golden_windows(PER_SPLIT)
    seen = Counter(tuple(r) for r in out)
    missing = [g for g in golden if tuple(g) not in seen]
    assert not missing, f"{len(missing)} window results lost, e.g. {missing[:3]}"
    assert set(seen) == {tuple(g) for g in golden}
    duplicates = sum(n - 1 for n in seen.values())
    print(f"at-least-once: {len(out)} records for {len(golden)} results, {duplicates} duplicates, {kills.count} kills")
