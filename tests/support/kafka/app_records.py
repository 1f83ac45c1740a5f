"""Records and state of the consumer-application tests (``runtime.Application``).

:func:`produce_keys` writes keyed records (keys ``u0`` .. ``u6``) to a topic of the test broker
and returns where each one landed; :func:`counts_before` folds them into per-key counts up to a
checkpoint's offsets (the model); :func:`counts_at` reads the ``count`` state of a checkpoint
from the root (the application must have stopped).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

import statelog
from statelog import ValueStateDescriptor

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
KEYS = 7

Record = tuple[int, int, str]  # partition, offset, key


def produce_keys(broker: Any, topic: str, n: int, first: int = 0) -> list[Record]:
    """``n`` records with keys ``u{i % KEYS}`` for ``i`` from ``first``; their (partition, offset, key)."""
    from confluent_kafka import Producer

    producer = Producer(broker.config(**{"enable.idempotence": True, "linger.ms": 5}))
    delivered: list[Record] = []

    def on_delivery(err: object, msg: Any) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key().decode()))

    for i in range(first, first + n):
        producer.produce(topic, key=f"u{i % KEYS}".encode(), value=str(i).encode(), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert len(delivered) == n
    return delivered


def end_offsets(records: list[Record], partitions: int) -> dict[int, int]:
    """partition -> one past its last record (0 for a partition without records)."""
    out: dict[int, int] = dict.fromkeys(range(partitions), 0)
    for partition, offset, _ in records:
        out[partition] = max(out.get(partition, 0), offset + 1)
    return out


def counts_before(records: list[Record], offsets: Mapping[int, int]) -> dict[str, int]:
    """Per-key counts of the records before ``offsets`` (partition -> next offset)."""
    return dict(Counter(key for partition, offset, key in records if offset < offsets.get(partition, 0)))


def counts_at(root: str, uid: str, meta: statelog.CheckpointMetadata | None = None) -> dict[str, int]:
    """The ``count`` state of operator ``uid`` at checkpoint ``meta`` (default: the latest)."""
    with statelog.open(root, create=False) as job:
        backend = job.backend(uid, restore=meta or "latest", changelog=False)
        try:
            return {key: value for key, _, value in backend.get_state(COUNT).entries() if value}
        finally:
            backend.close()


def latest_checkpoint(root: str) -> statelog.CheckpointMetadata | None:
    """The root's latest checkpoint, read without the writer lease (while a writer runs)."""
    with statelog.open(root, create=False, writer_lease=False) as job:
        return job.latest_checkpoint()
