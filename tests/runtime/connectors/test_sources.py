"""runtime.connectors.sources.records_to_batch: what a source's records become with
from_source(..., batches=True) when its reader has no batches of its own."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pyarrow as pa
import pytest

from runtime.connectors.kafka import KafkaRecord
from runtime.connectors.sources import records_to_batch
from runtime.errors import JobGraphError

Pair = namedtuple("Pair", ["a", "b"])


@dataclass
class Row:
    a: int
    b: str


@pytest.mark.parametrize("records", [
    [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}],
    [Row(1, "x"), Row(2, "y")],
    [Pair(1, "x"), Pair(2, "y")],
])
def test_records_with_fields_give_a_column_per_field(records: list) -> None:
    batch = records_to_batch(records)
    assert batch is not None and batch.to_pylist() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]


def test_kafka_records_and_plain_values() -> None:
    batch = records_to_batch([KafkaRecord("t", 0, 5, 1000, b"k", b"v")])
    assert batch is not None and batch.to_pylist()[0]["offset"] == 5 and batch.schema.names[:3] == [
        "topic", "partition", "offset"]
    plain = records_to_batch([1, 2, 3])
    assert plain is not None and plain.schema == pa.schema([("value", pa.int64())])
    assert records_to_batch([]) is None


def test_records_of_mixed_shapes_are_refused_with_what_to_do() -> None:
    with pytest.raises(JobGraphError, match="do not convert to an Arrow record batch .* records of one shape"):
        records_to_batch([{"a": 1}, {"a": "x"}])
