"""The descriptors of a job with every state kind, one definition for the tests that need one
(the Spark tests' job, ``tests/support/spark/jobs.py``; the disk working set's tests,
``tests/statelog/state/test_disk.py``).

:func:`every_state_kind` gives value (with a default), list, map, reducing, aggregating (a
struct accumulator), pickled value, TTL value, list and map, and a map with pickled keys.
The property tests' reference model (``tests/support/harness.py``) keeps its own set: its
model encodes those states' semantics (a value without default, a pickled accumulator).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from statelog import (
    PICKLE,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    TtlConfig,
    ValueStateDescriptor,
)
from statelog.descriptors import StateDescriptor

AVG_TYPE = pa.struct([("sum", pa.int64()), ("count", pa.int64())])


class Avg:
    """Average as an aggregate function with a typed ``{sum, count}`` accumulator."""

    def create_accumulator(self) -> dict:
        return {"sum": 0, "count": 0}

    def add(self, value: int, acc: dict) -> dict:
        return {"sum": acc["sum"] + value, "count": acc["count"] + 1}

    def get_result(self, acc: dict) -> float:
        return acc["sum"] / max(1, acc["count"])


def _add(a: Any, b: Any) -> Any:
    return a + b


def every_state_kind(ttl_ms: int) -> list[StateDescriptor]:
    """One descriptor of every state kind; the TTL states expire ``ttl_ms`` after a write."""
    return [
        ValueStateDescriptor("count", pa.int64(), default=0),
        ListStateDescriptor("seen", pa.string()),
        MapStateDescriptor("attrs", pa.int64(), key_type=pa.string()),
        ReducingStateDescriptor("total", pa.int64(), reduce_fn=_add),
        AggregatingStateDescriptor("avg", AVG_TYPE, aggregate=Avg()),
        ValueStateDescriptor("blob", PICKLE),
        ValueStateDescriptor("ttl_v", pa.int64(), TtlConfig(ttl_ms)),
        ListStateDescriptor("ttl_l", pa.int64(), TtlConfig(ttl_ms)),
        MapStateDescriptor("ttl_m", PICKLE, TtlConfig(ttl_ms), key_type=pa.string()),
        MapStateDescriptor("pmap", pa.string(), key_type=PICKLE),
    ]
