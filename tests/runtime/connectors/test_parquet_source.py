"""The Parquet file source: rows as dicts or tuples, restores at record offsets (inside a row
group, at a row-group boundary, at the end), clear errors; end to end with a worker kill and
a restore at another parallelism, against the golden window counts of ``tests/support/jobs.py``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import statelog
from runtime import (
    FileSink,
    JobGraphError,
    ParquetSource,
    StreamExecutionEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    read_committed,
)
from runtime.connectors.sources import SourceSplits
from statelog.checkpoint.history import read_history
from tests.support import jobs
from tests.support.chaos import kill_workers
from tests.support.jobs import make_env
from tests.support.parquet_clicks import COLUMNS, PER_SPLIT, ROW_GROUP, read_all, write_clicks
from tests.support.s3server import RootSpec

# -- unit ----------------------------------------------------------------------------------------


def test_reads_every_row_as_dicts_and_tuples_across_row_groups_and_files(tmp_path: Path) -> None:
    write_clicks(tmp_path, 25, row_group_size=10, splits=2)  # row groups of 10, 10, 5
    assert pq.ParquetFile(tmp_path / "clicks-0.parquet").metadata.num_row_groups == 3
    src = ParquetSource(tmp_path, row="tuple")
    assert src.splits() == ["clicks-0.parquet", "clicks-1.parquet"]
    for k, split in enumerate(src.splits()):
        r = src.reader(split, None)
        assert read_all(r, 7) == [jobs.make_click(k, i) for i in range(25)]
        assert r.position() == {"offset": 25} and r.read(5) == []
        r.close()
    dicts = ParquetSource(tmp_path, "clicks-1.*").reader("clicks-1.parquet", None)
    got = read_all(dicts, 1000)
    assert got == [dict(zip(COLUMNS, jobs.make_click(1, i), strict=True)) for i in range(25)]
    assert dicts.finished  # finished with the read that returned the last row
    # columns select and reorder
    picked = ParquetSource(tmp_path, columns=["i", "user"], row="tuple").reader("clicks-0.parquet", None)
    assert picked.read(3) == [(i, jobs.make_click(0, i)[0]) for i in range(3)]
    assert ParquetSource(tmp_path, columns=("ts",)).reader("clicks-0.parquet", None).read(1) == [
        {"ts": jobs.make_click(0, 0)[1]}
    ]


def test_a_file_without_rows_finishes_at_once(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    r = ParquetSource(tmp_path).reader("empty.parquet", None)
    assert r.finished and r.read(10) == [] and r.position() == {"offset": 0}


@pytest.mark.parametrize("offset", [13, 10, 20, 24, 25, 0])
def test_restore_seeks_to_the_record_offset(tmp_path: Path, offset: int) -> None:
    """Inside a row group (13, 24), at row-group boundaries (10, 20), at the end (25)."""
    write_clicks(tmp_path, 25, row_group_size=10, splits=1)
    src = ParquetSource(tmp_path, row="tuple")
    r = src.reader("clicks-0.parquet", {"offset": offset, "max_ts": 0})
    assert r.finished == (offset == 25)
    assert read_all(r, 4) == [jobs.make_click(0, i) for i in range(offset, 25)]
    assert r.position() == {"offset": 25}
    # a position taken mid-way resumes exactly after the rows read
    first = src.reader("clicks-0.parquet", {"offset": offset})
    head = first.read(3)
    again = src.reader("clicks-0.parquet", first.position())
    assert head + read_all(again, 100) == [jobs.make_click(0, i) for i in range(offset, 25)]


def test_source_splits_give_timestamps_watermarks_and_offsets(tmp_path: Path) -> None:
    write_clicks(tmp_path, 30, row_group_size=8, splits=2)
    src = ParquetSource(tmp_path, row="tuple")
    splits = SourceSplits(src, {"clicks-0.parquet": None, "clicks-1.parquet": {"offset": 20}},
                          WatermarkStrategy(jobs.click_ts, jobs.OOO_MS))
    values = []
    while not splits.finished:
        values += splits.read(6)
    assert sorted(v for v, _ in values) == sorted(
        [jobs.make_click(0, i) for i in range(30)] + [jobs.make_click(1, i) for i in range(20, 30)])
    assert all(ts == v[1] for v, ts in values)
    pos = splits.positions()
    assert pos["clicks-0.parquet"] == {"offset": 30, "max_ts": max(jobs.make_click(0, i)[1] for i in range(30))}
    assert pos["clicks-1.parquet"]["offset"] == 30
    splits.close()


def test_unknown_column_names_the_file_and_its_columns(tmp_path: Path) -> None:
    write_clicks(tmp_path, 5, row_group_size=2, splits=1)
    src = ParquetSource(tmp_path, columns=["user", "url"])
    with pytest.raises(JobGraphError, match=r"clicks-0.parquet has no column\(s\) \['url'\]; its columns are \['user', 'ts', 'split', 'i'\]"):
        src.splits()  # in the job master, before any worker starts
    with pytest.raises(JobGraphError, match="no column"):
        src.reader("clicks-0.parquet", None)


def test_an_offset_past_the_end_means_the_file_changed(tmp_path: Path) -> None:
    write_clicks(tmp_path, 5, row_group_size=2, splits=1)
    with pytest.raises(JobGraphError, match=r"row 6.*past the end of the file \(5 rows\).*must not change"):
        ParquetSource(tmp_path).reader("clicks-0.parquet", {"offset": 6})
    with pytest.raises(JobGraphError, match="the Parquet file is gone"):
        ParquetSource(tmp_path).reader("missing.parquet", {"offset": 1})


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    write_clicks(tmp_path, 5, row_group_size=2, splits=1)
    (tmp_path / "notes.parquet").write_text('{"not": "parquet"}\n')
    with pytest.raises(JobGraphError, match=r"notes.parquet is not a valid Parquet file"):
        ParquetSource(tmp_path).splits()
    with pytest.raises(JobGraphError, match=r"notes.parquet is not a valid Parquet file"):
        ParquetSource(tmp_path).reader("notes.parquet", None)
    assert ParquetSource(tmp_path, "clicks-*.parquet").splits() == ["clicks-0.parquet"]


def test_arguments_are_validated(tmp_path: Path) -> None:
    with pytest.raises(JobGraphError, match="row must be 'dict' or 'tuple'"):
        ParquetSource(tmp_path, row="list")
    with pytest.raises(JobGraphError, match="non-empty list of column names"):
        ParquetSource(tmp_path, columns="user")
    with pytest.raises(JobGraphError, match="non-empty list of column names"):
        ParquetSource(tmp_path, columns=[])
    with pytest.raises(JobGraphError, match=r"\['a'\] more than once"):
        ParquetSource(tmp_path, columns=["a", "b", "a"])
    with pytest.raises(JobGraphError, match="records_per_s must be > 0"):
        ParquetSource(tmp_path, records_per_s=0)
    with pytest.raises(JobGraphError, match="non-empty glob"):
        ParquetSource(tmp_path, pattern="")
    with pytest.raises(JobGraphError, match="does not exist"):
        ParquetSource(tmp_path / "nowhere").splits()


# -- end to end ----------------------------------------------------------------------------------



def dict_ts(row: dict[str, Any]) -> int:
    return row["ts"]


def dict_user(row: dict[str, Any]) -> str:
    return row["user"]


def build_parquet_windows(env: StreamExecutionEnvironment, src: Path, out: Path, row: str,
                          rate: float | None) -> None:
    ts, user = (dict_ts, dict_user) if row == "dict" else (jobs.click_ts, jobs.click_user)
    clicks = env.from_source(ParquetSource(src, row=row, records_per_s=rate), uid="parquet-clicks",
                             watermarks=WatermarkStrategy(ts, jobs.OOO_MS))
    (
        clicks.key_by(user)
        .window(TumblingEventTimeWindows(jobs.WINDOW_MS))
        .aggregate(jobs.CountClicks(), uid="window-count", window_function=jobs.window_row)
        .sink_to(FileSink(out), uid="windows-out")
    )


def test_parquet_windows_with_a_worker_kill_give_the_golden_output(file_root: RootSpec, tmp_path: Path) -> None:
    write_clicks(tmp_path / "input", PER_SPLIT, ROW_GROUP)
    env = make_env(file_root, parallelism=2, checkpoint_interval_s=0.2, mode="exactly_once_aligned")
    build_parquet_windows(env, tmp_path / "input", tmp_path / "out", "dict", rate=2000)
    client = env.execute_async("parquet-kill")
    kills = kill_workers(client, 1, random.Random(3), 0.4, 0.8)
    result = client.wait(120)
    assert kills.count == 1 and result.attempts == 2, (kills, result.failures)
    assert sorted(read_committed(tmp_path / "out")) == jobs.golden_windows(PER_SPLIT)
    with statelog.open(file_root.url) as job:
        final = job.load_checkpoint(result.final_checkpoint)
        history = read_history(job.store)
    assert {s: p["offset"] for s, p in final.sources["parquet-clicks"].items()} == {
        f"clicks-{k}.parquet": PER_SPLIT for k in range(jobs.CLICK_SPLITS)}
    # the root's checkpoint history: the restart with its cause, the checkpoints of both attempts
    assert history.errors == []
    restarts = [e for e in history.entries if e["status"] == "restart"]
    assert [(e["attempt"], e["cause"]) for e in restarts] == [(1, result.failures[0][:500])]
    done = [e for e in history.entries if e["status"] == "completed"]
    assert {e["attempt"] for e in done} <= {1, 2} and done[-1]["attempt"] == 2
    assert done[-1]["checkpoint_id"] == result.final_checkpoint
    assert all(e["duration_ms"] >= max(e["sync_ms"], e["async_ms"], e["alignment_ms"]) for e in done)


def test_restore_a_retained_checkpoint_at_another_parallelism(file_root: RootSpec, tmp_path: Path) -> None:
    write_clicks(tmp_path / "input", PER_SPLIT, ROW_GROUP)
    env = make_env(file_root, parallelism=2, checkpoint_interval_s=0.2, retain_checkpoints=50)
    build_parquet_windows(env, tmp_path / "input", tmp_path / "a", "tuple", rate=2500)
    result = env.execute("parquet-first", timeout_s=120)
    with statelog.open(file_root.url) as job:
        mid = [c for c in result.completed_checkpoints
               if 0 < sum(p["offset"] for p in job.load_checkpoint(c).sources["parquet-clicks"].values())
               < PER_SPLIT * jobs.CLICK_SPLITS]
        assert mid, result.completed_checkpoints
        cid = mid[len(mid) // 2]
        offsets = [p["offset"] for p in job.load_checkpoint(cid).sources["parquet-clicks"].values()]
    assert any(o % ROW_GROUP for o in offsets), offsets  # some split resumes inside a row group
    env = make_env(file_root, parallelism=3)
    build_parquet_windows(env, tmp_path / "input", tmp_path / "b", "tuple", rate=None)
    env.execute("parquet-restored", restore=cid, timeout_s=120)
    windows = read_committed(tmp_path / "a", upto_checkpoint=cid) + read_committed(tmp_path / "b")
    assert sorted(windows) == jobs.golden_windows(PER_SPLIT)


@pytest.mark.parametrize("offset", [0, 13, 10, 25])
@pytest.mark.parametrize("rows", [1, 4, 10, 11, 100])
def test_read_batch_slices_arrow_batches_across_row_groups_and_resumes_at_its_position(
    tmp_path: Path, offset: int, rows: int
) -> None:
    """from_source(batches=True): batches of up to ``rows`` rows, exact positions."""
    write_clicks(tmp_path, 25, row_group_size=10, splits=1)
    src = ParquetSource(tmp_path, columns=["split", "i"])
    r = src.reader("clicks-0.parquet", {"offset": offset})
    seen: list[int] = []
    while not r.finished:
        batch = r.read_batch(rows)
        assert isinstance(batch, pa.RecordBatch) and 0 < batch.num_rows <= rows
        assert batch.schema.names == ["split", "i"]
        seen += batch.column("i").to_pylist()
        assert r.position() == {"offset": offset + len(seen)}
        if len(seen) == 3:  # a restore from the position mid-way reads the rest
            again = src.reader("clicks-0.parquet", r.position())
            rest = again.read_batch(100)
            assert rest is not None and rest.column("i").to_pylist() == list(range(offset + 3, 25))
            again.close()
    assert seen == list(range(offset, 25)) and r.read_batch(rows) is None
    r.close()


def test_source_splits_read_batches_round_robin_counting_rows(tmp_path: Path) -> None:
    write_clicks(tmp_path, 30, row_group_size=8, splits=2)
    splits = SourceSplits(ParquetSource(tmp_path), {"clicks-0.parquet": None, "clicks-1.parquet": {"offset": 20}}, None)
    got: list[tuple[int, int]] = []
    while not splits.finished:
        out = splits.read_batch(6)
        assert len(out) == 1 and out[0][1] is None
        got += list(zip(out[0][0]["split"].to_pylist(), out[0][0]["i"].to_pylist(), strict=True))
    assert sorted(got) == [(0, i) for i in range(30)] + [(1, i) for i in range(20, 30)]
    assert splits.emitted == 40 and splits.read_batch(6) == []
    assert splits.positions() == {"clicks-0.parquet": {"offset": 30}, "clicks-1.parquet": {"offset": 30}}
    splits.close()
