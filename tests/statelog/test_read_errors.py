"""Errors say which kind of failure it is.

Every reader (changelog segments, state tables, manifests, checkpoint and savepoint metadata,
the materializer, ``statelog verify``, the Spark-side reader) raises a :class:`StoreError`
when the store is unreachable or fails (``TransientStoreError``, retryable, for timeouts,
connection errors and 5xx; ``StorePermissionError`` for a refusal), naming the object key;
only damaged bytes raise :class:`CorruptionError`, naming the object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import statelog
from materializer.build import materialize
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.catalog import JobCatalog, load_savepoint
from statelog.errors import CorruptionError, StoreError, StorePermissionError, TransientStoreError
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import load_manifest
from statelog.store import open_store
from statelog.testing import OUTAGES, FaultInjectingStore
from tests.support.gc_job import COUNT, EVENTS, MAXP, OPTIONS, Built, build
from tests.support.s3server import RootSpec
from tools.roots import Root
from tools.verify import verify_root

EXPECTED: dict[str, type[StoreError]] = {
    "timeout": TransientStoreError,
    "connection": TransientStoreError,
    "server": TransientStoreError,
    "permission": StorePermissionError,
}
READS = ("get", "get_range")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Checkpoints 1..3 of operators ``counter`` (p=2) and ``sessions``; checkpoint 3 builds on
    the materialization of checkpoint 2 plus changelog; savepoint ``sp``. Read-only below."""
    from materializer.savepoint import create_savepoint

    root = tmp_path_factory.mktemp("read-errors")
    spec = RootSpec(root.as_uri())
    out = build(spec, rounds=3, materialize_after=(2,))
    with spec.open() as store:
        create_savepoint(store, 3, "sp", options=OPTIONS)
    assert out.metas[3].manifest_keys() and out.metas[3].segment_names()
    return out


@pytest.fixture
def faulty(built: Built) -> Iterator[FaultInjectingStore]:
    store = FaultInjectingStore(open_store(built.spec.url))
    yield store
    store.close()


def fail_reads(store: FaultInjectingStore, prefix: str, error: Callable[[str, str], StoreError]) -> None:
    for op in READS:
        store.fail_next(op, 10_000, error=error, key_prefix=prefix)


def restore_counter(store: FaultInjectingStore, cid: int | str = 3) -> dict[Any, Any]:
    job = statelog.open(store.url, store=store, create=False, writer_lease=False)
    try:
        out: dict[Any, Any] = {}
        for i in range(2):
            b = job.backend("counter", subtask=i, parallelism=2, restore=cid, changelog=False)
            b.get_state(COUNT)
            out.update((k, v) for k, _ns, v in b.entries("count"))
        return out
    finally:
        job.close()


def assert_store_error(exc: pytest.ExceptionInfo[BaseException], outage: str, prefix: str) -> None:
    err = exc.value
    assert type(err) is EXPECTED[outage], repr(err)
    assert not isinstance(err, CorruptionError)
    assert err.retryable is (outage != "permission")
    assert err.key is not None and err.key.startswith(prefix), err.key
    assert err.key in str(err), str(err)


# -- each reader, each outage ------------------------------------------------------------------


@pytest.mark.parametrize("outage", sorted(OUTAGES))
@pytest.mark.parametrize(
    "prefix", ["changelog/", "materializations/data/", "materializations/manifests/", "checkpoints/"]
)
def test_restore_raises_store_errors(faulty: FaultInjectingStore, outage: str, prefix: str) -> None:
    fail_reads(faulty, prefix, OUTAGES[outage])
    with pytest.raises(StoreError) as exc:
        restore_counter(faulty)
    assert_store_error(exc, outage, prefix)


@pytest.mark.parametrize("outage", sorted(OUTAGES))
def test_segment_reader_raises_store_errors(built: Built, faulty: FaultInjectingStore, outage: str) -> None:
    meta = built.metas[3]
    r = next(r for op in meta.operators.values() for h in op.subtasks for r in h.changelog)
    fail_reads(faulty, "changelog/", OUTAGES[outage])
    reader = SegmentReader(faulty)
    with pytest.raises(StoreError) as exc:
        list(reader.read_range(r.stream, r.start, r.end, KeyGroupRange(0, MAXP - 1), r.segments))
    assert_store_error(exc, outage, "changelog/")
    with pytest.raises(StoreError) as exc:
        reader.verify_segment(r.segments[0].name, r.segments[0].size)
    assert_store_error(exc, outage, "changelog/")


@pytest.mark.parametrize("outage", sorted(OUTAGES))
def test_metadata_and_manifest_loads_raise_store_errors(
    built: Built, faulty: FaultInjectingStore, outage: str
) -> None:
    fail_reads(faulty, "", OUTAGES[outage])
    with pytest.raises(StoreError) as exc:
        JobCatalog(faulty).load(3)
    assert_store_error(exc, outage, "checkpoints/")
    with pytest.raises(StoreError) as exc:
        JobCatalog(faulty).read_job()
    assert_store_error(exc, outage, "job.json")
    with pytest.raises(StoreError) as exc:
        load_savepoint(faulty, "sp")
    assert_store_error(exc, outage, "savepoints/sp/")
    with pytest.raises(StoreError) as exc:
        load_manifest(faulty, built.manifests[2].key)
    assert_store_error(exc, outage, "materializations/manifests/")


@pytest.mark.parametrize("outage", sorted(OUTAGES))
@pytest.mark.parametrize("prefix", ["changelog/", "materializations/data/", "materializations/manifests/"])
def test_materializer_reads_raise_store_errors(
    built: Built, faulty: FaultInjectingStore, outage: str, prefix: str
) -> None:
    fail_reads(faulty, prefix, OUTAGES[outage])
    with pytest.raises(StoreError) as exc:
        materialize(faulty, built.metas[3], options=OPTIONS)
    assert_store_error(exc, outage, prefix)


@pytest.mark.parametrize("outage", sorted(OUTAGES))
@pytest.mark.parametrize("prefix", ["changelog/", "materializations/data/", "materializations/manifests/"])
def test_spark_state_reader_raises_store_errors(
    built: Built, faulty: FaultInjectingStore, outage: str, prefix: str
) -> None:
    pytest.importorskip("pyspark")
    from statelog.readers.restore import read_state_changes

    meta = built.metas[3]
    name = "events" if prefix != "changelog/" else EVENTS.name
    fail_reads(faulty, prefix, OUTAGES[outage])
    with pytest.raises(StoreError) as exc:
        read_state_changes(faulty, meta.operators["sessions"], name, KeyGroupRange(0, MAXP - 1))
    assert_store_error(exc, outage, prefix)


@pytest.mark.parametrize("outage", ["timeout", "permission"])
def test_verify_reports_store_errors_as_store_faults(faulty: FaultInjectingStore, outage: str) -> None:
    fail_reads(faulty, "changelog/", OUTAGES[outage])
    report = verify_root(Root(faulty.url, JobCatalog(faulty)))
    assert report.faults
    for fault in report.faults:
        assert fault.object.startswith("changelog/"), fault
        assert fault.error == EXPECTED[outage].__name__, fault
        assert fault.object in fault.message


# -- damaged bytes are still corruption --------------------------------------------------------


@pytest.mark.parametrize("prefix", ["changelog/", "materializations/data/", "materializations/manifests/"])
def test_corrupt_bytes_still_raise_corruption(faulty: FaultInjectingStore, prefix: str) -> None:
    faulty.corrupt_reads(prefix)
    if prefix != "changelog/":  # a restore checks only the blocks it reads; a flipped byte may be elsewhere
        with pytest.raises(CorruptionError) as exc:
            restore_counter(faulty)
        assert exc.value.key is not None and exc.value.key.startswith(prefix)
        assert exc.value.key in str(exc.value)
    report = verify_root(Root(faulty.url, JobCatalog(faulty)))
    assert report.faults and {f.error for f in report.faults} <= {"CorruptionError"}, report.faults


def test_restore_works_without_faults(built: Built, faulty: FaultInjectingStore) -> None:
    assert restore_counter(faulty) == built.expected[3]["count"]


# -- the S3 store, its server stopped in the middle of a restore -------------------------------


@pytest.mark.slow
def test_s3_server_stopped_mid_read_is_a_transient_store_error(tmp_path: Path) -> None:
    from tests.support.s3server import start_seaweedfs

    server = start_seaweedfs(tmp_path / "weed")
    try:
        spec = server.unique_root()
        build(spec, rounds=2, materialize_after=())
        options = {**spec.options, "retry": {"max_attempts": 2, "base_delay": 0.01, "max_delay": 0.01}}
        store = FaultInjectingStore(open_store(spec.url, options))
        stopped: list[str] = []

        def stop_server(op: str, key: str) -> None:
            # the descriptor and the metadata are read first: stop at the first segment read
            if not stopped and key.startswith("changelog/"):
                stopped.append(key)
                server.stop()

        store.before("get", stop_server)
        store.before("get_range", stop_server)
        with pytest.raises(StoreError) as exc:
            restore_counter(store, 2)
        store.close()
    finally:
        server.stop()
    assert stopped and stopped[0].startswith("changelog/")
    assert type(exc.value) is TransientStoreError, repr(exc.value)
    assert exc.value.retryable
    assert exc.value.key == stopped[0] and stopped[0] in str(exc.value)
