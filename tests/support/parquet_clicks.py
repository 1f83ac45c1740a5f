"""The clicks of ``tests/support/jobs.py`` as Parquet files, for the Parquet source's tests
(``tests/runtime/connectors/test_parquet_source*.py``), and reading a split reader to its end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support import jobs

PER_SPLIT = 1500  # rows per file of the end-to-end tests
ROW_GROUP = 300

COLUMNS = ["user", "ts", "split", "i"]


def write_clicks(directory: Path, per_split: int, row_group_size: int, splits: int = jobs.CLICK_SPLITS) -> None:
    """``clicks-<k>.parquet``: the rows ``jobs.make_click(k, i)`` in row groups of ``row_group_size``."""
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(splits):
        rows = [jobs.make_click(k, i) for i in range(per_split)]
        table = pa.table({name: [r[j] for r in rows] for j, name in enumerate(COLUMNS)})
        pq.write_table(table, directory / f"clicks-{k}.parquet", row_group_size=row_group_size)


def read_all(reader: Any, batch: int) -> list[Any]:
    out: list[Any] = []
    while not reader.finished:
        got = reader.read(batch)
        assert len(got) <= batch
        out += got
    return out
