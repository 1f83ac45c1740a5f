"""``ParquetSource`` on an ``s3://`` directory (SeaweedFS), read through statelog's store layer:
the same rows and restores at record offsets as from a local directory, and end to end with a
worker kill against the golden window counts."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from runtime import (
    FileSink,
    JobGraphError,
    ParquetSource,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    read_committed,
)
from statelog.store import open_store
from tests.support import jobs
from tests.support.chaos import kill_workers
from tests.support.jobs import make_env
from tests.support.parquet_clicks import (
    PER_SPLIT,
    ROW_GROUP,
    read_all,
    write_clicks,
)
from tests.support.s3server import RootSpec, S3Server

pytestmark = pytest.mark.s3


def upload(local: Path, s3_server: S3Server) -> str:
    """The files of ``local`` below a fresh ``s3://`` prefix, plus objects the source must skip."""
    url = f"s3://{s3_server.bucket}/input-{uuid.uuid4().hex}"
    store = open_store(url, s3_server.options())
    try:
        for p in sorted(local.iterdir()):
            store.put(p.name, p.read_bytes())
        store.put("notes.txt", b"not parquet, not matched")
        store.put("nested/clicks-9.parquet", b"below the prefix's top level: not a split")
    finally:
        store.close()
    return url


def test_reads_the_same_rows_as_from_a_local_directory_at_any_offset(s3_server: S3Server, tmp_path: Path) -> None:
    write_clicks(tmp_path / "input", 700, ROW_GROUP, splits=2)
    url = upload(tmp_path / "input", s3_server)
    remote = ParquetSource(url, row="tuple", store_options=s3_server.options())
    local = ParquetSource(tmp_path / "input", row="tuple")
    assert remote.splits() == local.splits() == ["clicks-0.parquet", "clicks-1.parquet"]
    for split in remote.splits():
        for offset in (0, 450, 600, 700):  # inside a row group, at a boundary, at the end
            got = read_all(remote.reader(split, {"offset": offset}), 128)
            assert got == read_all(local.reader(split, {"offset": offset}), 128), (split, offset)
    assert s3_server.secret_key not in repr(remote.store_options)


def test_store_options_are_refused_for_a_local_directory(tmp_path: Path) -> None:
    with pytest.raises(JobGraphError, match="store_options apply to s3:// directories only"):
        ParquetSource(tmp_path, store_options={"region": "x"})


@pytest.mark.slow
def test_windows_from_s3_input_with_a_worker_kill_give_the_golden_output(
    s3_server: S3Server, file_root: RootSpec, tmp_path: Path
) -> None:
    write_clicks(tmp_path / "input", PER_SPLIT, ROW_GROUP)
    url = upload(tmp_path / "input", s3_server)
    env = make_env(file_root, parallelism=2, checkpoint_interval_s=0.2)
    src = ParquetSource(url, row="tuple", records_per_s=2000, store_options=s3_server.options())
    (
        env.from_source(src, uid="parquet-clicks", watermarks=WatermarkStrategy(jobs.click_ts, jobs.OOO_MS))
        .key_by(jobs.click_user)
        .window(TumblingEventTimeWindows(jobs.WINDOW_MS))
        .aggregate(jobs.CountClicks(), uid="window-count", window_function=jobs.window_row)
        .sink_to(FileSink(tmp_path / "out"), uid="windows-out")
    )
    client = env.execute_async("parquet-s3-kill")
    kills = kill_workers(client, 1, random.Random(5), 0.4, 0.8)
    result = client.wait(120)
    assert kills.count == 1 and result.attempts == 2, (kills, result.failures)
    assert sorted(read_committed(tmp_path / "out")) == jobs.golden_windows(PER_SPLIT)
