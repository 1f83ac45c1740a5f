"""runtime.network.batch_router: a batch split by key group sends every row to the subtask the
per-record router picks (key_group_of and subtask_for_key_group), in the batch's order."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from runtime.graph import HASH
from runtime.network.batch_router import ColumnKey, split_by_key_group
from runtime.network.router import EdgeOutput
from statelog.errors import ConfigError
from statelog.keys.groups import key_group_of, subtask_for_key_group


@pytest.mark.parametrize("keys", [
    [random.Random(1).randrange(-10**12, 10**12) for _ in range(3000)],
    [f"user-{random.Random(2).randrange(10**6)}" for _ in range(3000)],
    [f"u{i}" * (i % 5 + 1) for i in range(3000)],
    [str(i).encode() for i in range(3000)],
])
@pytest.mark.parametrize(("max_parallelism", "parallelism"), [(128, 2), (4096, 3), (128, 1)])
def test_rows_go_where_the_per_record_router_sends_them(keys, max_parallelism, parallelism) -> None:
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array(range(len(keys)))], names=["k", "i"])
    parts = split_by_key_group(batch, "k", max_parallelism, parallelism)
    assert len(parts) == parallelism
    for sub, part in enumerate(parts):
        expected = [i for i, k in enumerate(keys)
                    if subtask_for_key_group(max_parallelism, parallelism, key_group_of(k, max_parallelism)) == sub]
        assert (part["i"].to_pylist() if part is not None else []) == expected


def test_an_unknown_key_column_says_which_columns_there_are() -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([1])], names=["user"])
    with pytest.raises(ConfigError, match=r"'userid' is not in the batch .*\['user'\]"):
        split_by_key_group(batch, "userid", 128, 2)


class _Channel:
    def __init__(self) -> None:
        self.frames: list[Any] = []

    def send(self, frame: Any) -> None:
        self.frames.append(frame)


def test_an_edge_keyed_by_a_column_sends_each_subtasks_rows_as_one_frame_after_its_records() -> None:
    """EdgeOutput with key_by("k"): records go by record["k"], a batch's parts go out at once
    behind the records buffered before them, in the order of the batch."""
    channels = [_Channel(), _Channel()]
    edge = EdgeOutput(HASH, ColumnKey("k"), channels, 128, batch_size=1000)
    keys = list(range(40))
    edge.emit({"k": 7}, 1)
    batch = pa.RecordBatch.from_pydict({"k": keys, "i": list(range(40))})
    edge.emit(batch, None)
    owner = subtask_for_key_group(128, 2, key_group_of(7, 128))
    for sub, ch in enumerate(channels):
        assert len(ch.frames) == 1
        records, event = ch.frames[0]
        assert event is None
        if sub == owner:
            assert records[0] == ({"k": 7}, 1)
            records = records[1:]
        (part, ts), = records
        assert ts is None and part["i"].to_pylist() == [
            k for k in keys if subtask_for_key_group(128, 2, key_group_of(k, 128)) == sub]
    assert edge.sent_records == 3


def test_a_column_key_refuses_a_batch_where_a_record_is_expected() -> None:
    assert ColumnKey("k")({"k": 3}) == 3
    with pytest.raises(ConfigError, match=r"a record batch reached a per-record keyed operator .* process_batches"):
        ColumnKey("k")(pa.RecordBatch.from_pydict({"k": [1]}))
