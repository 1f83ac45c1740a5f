"""A small job for the CLI tests (``tests/tools/cli/``): operators ``counter`` (parallelism 2)
and ``sessions`` (1), one checkpoint per round; and the CLI's store options of the test S3 server."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

import statelog
from statelog import (
    PICKLE,
    CheckpointMetadata,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from tests.support.s3server import RootSpec, S3Server

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
EVENTS = ListStateDescriptor("events", pa.string())
ATTRS = MapStateDescriptor("attrs", PICKLE, key_type=pa.string())


def build_job(
    spec: RootSpec, checkpoints: int = 3, restore: str | None = None, **job_options: Any
) -> list[CheckpointMetadata]:
    """Operators ``counter`` (parallelism 2) and ``sessions`` (1); one checkpoint per round."""
    job = statelog.open(spec.url, store_options=dict(spec.options), **job_options)
    metas = []
    try:
        counters = [
            job.backend("counter", subtask=i, parallelism=2, restore=restore) for i in range(2)
        ]
        sessions = job.backend("sessions", restore=restore)
        for round_ in range(checkpoints):
            for i in range(40):
                key = f"user-{i}"
                counter = counters[
                    statelog.subtask_for_key_group(128, 2, statelog.key_group_of(key, 128))
                ]
                counter.set_current_key(key)
                count = counter.get_state(COUNT)
                count.update(count.value() + 1)
                sessions.set_current_key(key)
                sessions.get_state(EVENTS).add(f"event-{round_}")
                sessions.get_state(ATTRS).put("round", {"n": round_})
            metas.append(job.checkpoint(sources={"events": {"p0": (round_ + 1) * 40}}))
    finally:
        job.close()
    return metas


def s3_args(server: S3Server, secret: str | None = None) -> list[str]:
    return [
        "--store-option",
        f"endpoint={server.endpoint}",
        "--store-option",
        f"access_key={server.access_key}",
        "--store-option",
        f"secret_key={secret or server.secret_key}",
    ]
