"""Job-root safety of the library entry point: checkpoint `sources` keep their
JSON types, a lost job descriptor is never silently recreated, a restore without `restore=`
on a root with checkpoints is refused, and the errors name what they looked for."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import (
    CheckpointNotFoundError,
    JobDescriptorMissingError,
    JobMismatchError,
    RestoreRequiredError,
    SavepointNotFoundError,
    SerializationError,
)
from statelog.layout import JOB_KEY, checkpoint_key
from statelog.store import open_store
from statelog.testing import FaultInjectingStore

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def _root(tmp_path: Path) -> str:
    return (tmp_path / "root").as_uri()


def _one_checkpoint(root: str, sources: dict | None = None, **kwargs: object) -> CheckpointMetadata:
    with statelog.open(root, **kwargs) as job:
        b = job.backend("counter")
        counts = b.get_state(COUNT)
        for user in ("a", "b", "a"):
            b.set_current_key(user)
            counts.update(counts.value() + 1)
        return job.checkpoint(sources=sources or {"events": 3})


# -- sources keep their JSON types --------------------------------------------------


def test_sources_keep_int_keys_and_json_types(tmp_path: Path) -> None:
    root = _root(tmp_path)
    sources = {
        "clicks": {0: 5, 1: 7},
        "mixed": {"a": [1, 2.5, None, True], 3: {"nested": {10: "x"}}},
        "flags": {True: 1, None: 2, 1.5: 3},
        "$pairs": {"$pairs": 1},
    }
    _one_checkpoint(root, sources)
    with statelog.open(root) as job:
        restored = job.latest_checkpoint()
        assert restored is not None
        assert restored.sources == sources
        assert restored.sources["clicks"][0] == 5
        assert list(restored.sources["clicks"]) == [0, 1]


def test_sources_with_str_keys_are_stored_as_before(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _one_checkpoint(root, {"events": {"p0": 3}})
    data = json.loads((tmp_path / "root" / checkpoint_key(1)).read_bytes())
    assert data["body"]["sources"] == {"events": {"p0": 3}}
    assert data["body"]["version"] == 2  # readable by older builds


def test_old_metadata_without_encoded_sources_still_reads(tmp_path: Path) -> None:
    root = _root(tmp_path)
    meta = _one_checkpoint(root, {"events": {"0": 3}})
    assert meta.sources == {"events": {"0": 3}}
    with statelog.open(root) as job:
        assert job.load_checkpoint(1).sources == {"events": {"0": 3}}


@pytest.mark.parametrize(
    ("sources", "where"),
    [
        ({"clicks": {0: {1, 2}}}, "sources['clicks'][0]"),
        ({"clicks": {(0, 1): 5}}, "sources['clicks']"),
        ({"clicks": [b"x"]}, "sources['clicks'][0]"),
        ({"clicks": float("nan")}, "sources['clicks']"),
    ],
)
def test_non_json_sources_are_refused_naming_the_entry(tmp_path: Path, sources: dict, where: str) -> None:
    root = _root(tmp_path)
    with statelog.open(root) as job:
        b = job.backend("counter")
        b.set_current_key("a")
        b.get_state(COUNT).update(1)
        with pytest.raises(SerializationError) as err:
            job.checkpoint(sources=sources)
        assert "sources" in str(err.value) and where in str(err.value)
        assert job.catalog.checkpoint_ids() == []  # nothing published


# -- a lost job descriptor is never silently recreated ------------------------------


def _counts(job: statelog.StateJob, restore: object) -> dict[str, int]:
    b = job.backend("counter", restore=restore)  # type: ignore[arg-type]
    state = b.get_state(COUNT)
    out = {}
    for user in ("a", "b"):
        b.set_current_key(user)
        out[user] = state.value()
    return out


@pytest.mark.parametrize("max_parallelism", [None, 64])
def test_lost_descriptor_is_not_recreated(tmp_path: Path, max_parallelism: int | None) -> None:
    root = _root(tmp_path)
    _one_checkpoint(root)
    descriptor = tmp_path / "root" / JOB_KEY
    descriptor.unlink()
    with pytest.raises(JobDescriptorMissingError) as err:
        statelog.open(root, max_parallelism=max_parallelism)
    msg = str(err.value)
    assert JOB_KEY in msg and "checkpoints/chk-000000000001.json" in msg
    assert "recover_descriptor=True" in msg
    assert not descriptor.exists()  # nothing wrong left behind
    with pytest.raises(JobDescriptorMissingError):  # readers (create=False) say the same
        statelog.open(root, create=False)


@pytest.mark.parametrize("prefix", ["materializations/manifests/", "savepoints/sp1/"])
def test_descriptor_not_created_over_materializations_or_savepoints(tmp_path: Path, prefix: str) -> None:
    root = _root(tmp_path)
    obj = tmp_path / "root" / prefix / "something.json"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"{}")
    with pytest.raises(JobDescriptorMissingError, match=prefix):
        statelog.open(root)
    assert not (tmp_path / "root" / JOB_KEY).exists()


def test_recover_descriptor_rebuilds_it_from_the_newest_checkpoint(tmp_path: Path) -> None:
    root = _root(tmp_path)
    meta = _one_checkpoint(root, max_parallelism=64)
    (tmp_path / "root" / JOB_KEY).unlink()
    with statelog.open(root, recover_descriptor=True) as job:
        assert (job.job_id, job.max_parallelism) == (meta.job_id, 64)
        assert _counts(job, "latest") == {"a": 2, "b": 1}
    with statelog.open(root) as job:  # the rebuilt descriptor is durable
        assert job.job_id == meta.job_id


def test_restore_refuses_a_checkpoint_of_another_job(tmp_path: Path) -> None:
    root = _root(tmp_path)
    meta = _one_checkpoint(root)
    other = tmp_path / "other"
    statelog.open(other.as_uri()).close()
    (tmp_path / "root" / JOB_KEY).write_bytes((other / JOB_KEY).read_bytes())
    with statelog.open(root) as job:
        assert job.job_id != meta.job_id
        with pytest.raises(JobMismatchError) as err:
            job.backend("counter", restore=1)
        assert meta.job_id in str(err.value) and job.job_id in str(err.value)


# -- an optional listing does not fail a checkpoint; missing metadata is named ------


def test_checkpoint_publishes_when_the_materialization_listing_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FaultInjectingStore(open_store(_root(tmp_path)))
    with statelog.open(_root(tmp_path), store=store) as job:
        b = job.backend("counter")
        b.set_current_key("a")
        b.get_state(COUNT).update(1)
        store.fail_next("list", 100, key_prefix="materializations/")
        with caplog.at_level(logging.WARNING, logger="statelog.job"):
            meta = job.checkpoint(sources={"events": 1})
        assert job.catalog.checkpoint_ids() == [meta.checkpoint_id]
        assert any("materialization" in r.getMessage() for r in caplog.records)


def test_missing_checkpoint_metadata_names_the_object_key(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _one_checkpoint(root)
    (tmp_path / "root" / checkpoint_key(1)).unlink()
    with statelog.open(root) as job:
        with pytest.raises(CheckpointNotFoundError, match="checkpoints/chk-000000000001.json"):
            job.backend("counter", restore=1)
        with pytest.raises(SavepointNotFoundError, match="savepoints/nightly/_metadata.json"):
            job.backend("counter", restore="savepoint:nightly")


# -- a root with checkpoints needs an explicit restore= ------------------------------


def test_backend_without_restore_on_a_root_with_checkpoints_is_refused(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _one_checkpoint(root)
    with statelog.open(root) as job:
        with pytest.raises(RestoreRequiredError) as err:
            job.backend("counter")
        msg = str(err.value)
        assert "checkpoint 1" in msg and "restore=" in msg and "'none'" in msg
        assert _counts(job, "none") == {"a": 0, "b": 0}  # the explicit fresh start
        job.backend("other-operator")  # an operator the checkpoint does not hold starts empty
    with statelog.open(root) as job:
        assert _counts(job, "latest") == {"a": 2, "b": 1}
