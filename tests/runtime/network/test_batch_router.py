"""runtime.network.batch_router: a batch split by key group sends every row to the subtask the
per-record router picks (key_group_of and subtask_for_key_group), in the batch's order."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from runtime.network.batch_router import split_by_key_group
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
