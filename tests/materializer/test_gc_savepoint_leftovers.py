"""GC and the leftovers of savepoint writes that never published (materializer/gc/plan.py):
collected once the newest object below ``savepoints/<name>/`` is older than the grace period,
never while a writer is in progress (its files or its refreshed in-progress marker are
young), and a published savepoint is never touched."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pytest

from materializer.gc.collect import collect_garbage
from statelog import ValueStateDescriptor
from statelog.errors import StoreError
from statelog.layout import savepoint_metadata_key, savepoint_prefix
from statelog.state_processor import SavepointWriter
from statelog.state_processor.progress import InProgress, marker_key
from statelog.testing import FaultInjectingStore
from tests.support.gc_job import FAR, listing
from tests.support.s3server import RootSpec

COUNT = ValueStateDescriptor("count", pa.int64())
ROWS = pa.table({"key": [f"user-{i}" for i in range(40)], "value": list(range(40))})


def _killed_write(spec: RootSpec, name: str) -> list[str]:
    """A write whose process dies before the metadata: tables, manifest and marker stay behind
    (the metadata put fails and so does every delete, as if nothing could clean up)."""
    store = FaultInjectingStore(spec.open())

    def die(op: str, key: str) -> None:
        if op == "delete" or key == savepoint_metadata_key(name):
            raise StoreError("writer killed", key=key)

    store.before("put", die)
    store.before("delete", die)
    w = SavepointWriter(spec.url, name, max_parallelism=32, store=store)
    w.add("op", COUNT, ROWS)
    with pytest.raises(StoreError, match="writer killed"):
        w.publish()
    with spec.open() as s:
        left = sorted(listing(s, savepoint_prefix(name)))
    assert any(k.endswith(".parquet") for k in left) and marker_key(name) in left
    assert savepoint_metadata_key(name) not in left
    return left


def _age(spec: RootSpec, keys: list[str], seconds: float) -> None:
    root = Path(urlparse(spec.url).path)
    for k in keys:
        t = os.stat(root / k).st_mtime - seconds
        os.utime(root / k, (t, t))


def test_leftovers_of_a_killed_write_are_collected_after_grace_not_before(store_root: RootSpec) -> None:
    left = _killed_write(store_root, "crashed")
    with store_root.open() as store:
        newest = max(listing(store, savepoint_prefix("crashed")).values())
        early = collect_garbage(store, grace_s=600, now=newest + 599)
        assert not set(left) & set(early.deleted_keys)
        assert early.protected["other"].objects >= len(left)
        assert sorted(listing(store, savepoint_prefix("crashed"))) == left
        late = collect_garbage(store, grace_s=600, now=newest + 601)
        assert set(left) <= set(late.deleted_keys)
        assert listing(store, savepoint_prefix("crashed")) == {}
    # the name is free again: a new write under it publishes
    with SavepointWriter(store_root.url, "crashed", store_options=store_root.options) as w:
        w.add("op", COUNT, ROWS)
        assert w.publish().savepoint == "crashed"


def test_published_savepoint_is_never_collected(file_root: RootSpec) -> None:
    with SavepointWriter(file_root.url, "kept", max_parallelism=32) as w:
        w.add("op", COUNT, ROWS)
        w.publish()
    _killed_write(file_root, "crashed")
    with file_root.open() as store:
        before = listing(store, savepoint_prefix("kept"))
        assert marker_key("kept") not in before  # the marker goes once the metadata is written
        report = collect_garbage(store, grace_s=0, now=time.time() + FAR)
        assert not any(k.startswith(savepoint_prefix("kept")) for k in report.deleted_keys)
        assert listing(store, savepoint_prefix("kept")) == before
        assert listing(store, savepoint_prefix("crashed")) == {}
        assert report.savepoints == ("kept",)


def test_write_in_progress_is_not_collected(file_root: RootSpec) -> None:
    # young files: a GC run while the writer puts its metadata keeps everything
    store = FaultInjectingStore(file_root.open())
    reports = []

    def gc_now(_op: str, key: str) -> None:
        if key == savepoint_metadata_key("running"):
            reports.append(collect_garbage(store.inner, grace_s=600))

    store.before("put", gc_now)
    w = SavepointWriter(file_root.url, "running", max_parallelism=32, store=store)
    w.add("op", COUNT, ROWS)
    w.publish()
    assert len(reports) == 1 and not any(k.startswith("savepoints/") for k in reports[0].deleted_keys)
    assert reports[0].protected["other"].objects >= 2

    # a long stage: its files are older than the grace period, the refreshed marker is not
    left = _killed_write(file_root, "long")
    _age(file_root, left, 3600)
    with file_root.open() as s:
        s.delete(marker_key("long"))  # the dead writer's marker, aged with the rest
        progress = InProgress(s, "long", interval_s=0.01).start()
        try:
            refreshed = threading.Event()
            while not refreshed.wait(0.01):  # until the marker was refreshed once
                if s.head(marker_key("long", 1)) is not None or progress.n > 1:
                    refreshed.set()
            report = collect_garbage(s, grace_s=600)
            assert not any(k.startswith("savepoints/") for k in report.deleted_keys)
            assert set(left) - {marker_key("long")} <= set(listing(s, savepoint_prefix("long")))
        finally:
            progress.stop()
        # the writer is gone: once its marker is older than the grace period, all of it goes
        gone = collect_garbage(s, grace_s=600, now=time.time() + 601)
        assert set(left) - {marker_key("long")} <= set(gone.deleted_keys)
        assert listing(s, savepoint_prefix("long")) == {}
