"""Every reference is bound to what it references.

A valid object copied over another valid object of the same kind (a manifest over another
manifest, a materialization's manifest over a savepoint's, a savepoint's metadata over
another's, a checkpoint's metadata over another checkpoint's, a table file over another
table file of the same state) must never yield wrong state: restore, the materializer, GC,
savepoints and the Spark-side reader fail with a ``CorruptionError`` naming the object.
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

import pytest

import statelog
from materializer.build import materialize
from materializer.gc.collect import collect_garbage
from materializer.savepoint import create_savepoint, list_savepoints
from statelog.checkpoint.catalog import JobCatalog, load_savepoint
from statelog.checkpoint.metadata import CheckpointMetadata, MaterializedPart
from statelog.errors import CorruptionError
from statelog.keys.groups import KeyGroupRange
from statelog.layout import checkpoint_key, savepoint_manifest_key, savepoint_metadata_key
from statelog.materialization.manifest import Manifest, load_manifest
from statelog.readers.restore import read_state_changes
from tests.support.gc_job import (
    FAR,
    MAXP,
    OPTIONS,
    Built,
    build,
    copy_over,
    overwrite,
    read_state,
    swap_table_file,
)
from tests.support.s3server import RootSpec


def rewrap(data: bytes, edit: Any) -> bytes:
    """The bytes of a checksummed JSON object after ``edit(body)``, with a valid checksum."""
    body = json.loads(data)["body"]
    edit(body)
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"crc32": zlib.crc32(canon), "body": body}, sort_keys=True, separators=(",", ":")).encode()


@pytest.fixture
def built(file_root: RootSpec) -> Built:
    """Checkpoints 1..6; M1 of checkpoint 2 (bases of 3 and 4), M2 of 4 (bases of 5 and 6);
    savepoints ``sp5`` and ``sp6``."""
    out = build(file_root, rounds=6, materialize_after=(2, 4))
    with file_root.open() as store:
        create_savepoint(store, 5, "sp5", options=OPTIONS)
        create_savepoint(store, 6, "sp6", options=OPTIONS)
    assert out.metas[6].manifest_keys() == {out.manifests[4].key}
    assert out.metas[4].manifest_keys() == {out.manifests[2].key}
    return out


def m1(b: Built) -> str:
    return b.manifests[2].key


def m2(b: Built) -> str:
    return b.manifests[4].key


def assert_names(exc: pytest.ExceptionInfo[CorruptionError], key: str) -> None:
    assert exc.value.key == key, exc.value
    assert key in str(exc.value)


# -- references record the size and CRC-32 of what they reference --------------------------------


def test_references_record_size_and_checksum(built: Built) -> None:
    with built.spec.open() as store:
        for cid in (3, 4, 5, 6):
            meta = JobCatalog(store).load(cid)
            for op in meta.operators.values():
                for h in op.subtasks:
                    for p in h.materialization:
                        data = store.get(p.manifest)
                        assert (p.bytes, p.crc32) == (len(data), zlib.crc32(data)), (cid, p)
        sp = load_savepoint(store, "sp6")
        assert sp.savepoint == "sp6"
        data = store.get(savepoint_manifest_key("sp6"))
        for op in sp.operators.values():
            for h in op.subtasks:
                assert [(p.bytes, p.crc32) for p in h.materialization] == [(len(data), zlib.crc32(data))]
        manifest = load_manifest(store, savepoint_manifest_key("sp6"))
        assert (manifest.kind, manifest.savepoint) == ("savepoint", "sp6")
        assert load_manifest(store, m2(built)).savepoint is None


def test_restricted_part_keeps_the_binding() -> None:
    part = MaterializedPart("materializations/manifests/x.json", KeyGroupRange(0, 31), 100, 7)
    sub = part.restrict(KeyGroupRange(4, 8))
    assert sub == MaterializedPart("materializations/manifests/x.json", KeyGroupRange(4, 8), 100, 7)
    assert MaterializedPart.from_json(sub.to_json()) == sub
    old = MaterializedPart.from_json({"manifest": "k", "key_groups": [0, 3]})  # written before the binding
    assert (old.bytes, old.crc32) == (None, None) and "bytes" not in old.to_json()


# -- a manifest in the place of another ----------------------------------------------------------


def test_manifest_copied_over_another_fails_restore_naming_it(built: Built) -> None:
    assert read_state(built.spec, 6) == built.expected[6]
    copy_over(built.spec, m1(built), m2(built))  # M2 <- M1: valid bytes, wrong object
    for cid in (5, 6):
        with pytest.raises(CorruptionError) as exc:
            read_state(built.spec, cid)
        assert_names(exc, m2(built))
    assert read_state(built.spec, 4) == built.expected[4]  # builds on M1, untouched


def test_manifest_identity_is_checked_against_its_key(built: Built) -> None:
    """Without any reference (listing, adoption): the manifest must say it is the one named."""
    copy_over(built.spec, m1(built), m2(built))
    with built.spec.open() as store:
        with pytest.raises(CorruptionError) as exc:
            load_manifest(store, m2(built))
        assert_names(exc, m2(built))
        assert built.manifests[2].mid in str(exc.value)
        # the newest materialization is what backends adopt: a wrong one is never adopted
        job = statelog.open(built.spec.url, create=False)
        try:
            with pytest.raises(CorruptionError) as exc:
                job.latest_materialization()
            assert_names(exc, m2(built))
        finally:
            job.close()


def test_manifest_with_its_own_identity_but_other_bytes_fails_by_reference(built: Built) -> None:
    """The identity fields are right, the content is not what checkpoint 6 referenced."""
    with built.spec.open() as store:
        data = store.get(m2(built))

    def drop_a_file(body: dict[str, Any]) -> None:
        files = body["operators"]["counter"]["files"]["count"]
        assert len(files) > 1
        files.pop()

    overwrite(built.spec, m2(built), rewrap(data, drop_a_file))
    with built.spec.open() as store:
        assert load_manifest(store, m2(built)).mid == built.manifests[4].mid  # identity still holds
    with pytest.raises(CorruptionError) as exc:
        read_state(built.spec, 6)
    assert_names(exc, m2(built))
    assert "checkpoint" in str(exc.value) and "bytes" in str(exc.value)


def test_manifest_of_a_materialization_over_a_savepoints_fails(built: Built) -> None:
    assert read_state(built.spec, "savepoint:sp6") == built.expected[6]
    copy_over(built.spec, m2(built), savepoint_manifest_key("sp6"))
    with pytest.raises(CorruptionError) as exc:
        read_state(built.spec, "savepoint:sp6")
    assert_names(exc, savepoint_manifest_key("sp6"))
    with built.spec.open() as store:
        with pytest.raises(CorruptionError) as exc:
            load_manifest(store, savepoint_manifest_key("sp6"))
        assert "materialization" in str(exc.value) and "savepoint" in str(exc.value)
        [sp5, sp6] = list_savepoints(store)
        assert "error" not in sp5 and sp6["name"] == "sp6"


def test_savepoint_manifest_over_another_savepoints_fails(built: Built) -> None:
    copy_over(built.spec, savepoint_manifest_key("sp5"), savepoint_manifest_key("sp6"))
    with pytest.raises(CorruptionError) as exc:
        read_state(built.spec, "savepoint:sp6")
    assert_names(exc, savepoint_manifest_key("sp6"))
    assert read_state(built.spec, "savepoint:sp5") == built.expected[5]


def test_savepoint_metadata_over_another_savepoints_fails(built: Built) -> None:
    copy_over(built.spec, savepoint_metadata_key("sp5"), savepoint_metadata_key("sp6"))
    with built.spec.open() as store, pytest.raises(CorruptionError) as exc:
        load_savepoint(store, "sp6")
    assert_names(exc, savepoint_metadata_key("sp6"))
    with pytest.raises(CorruptionError) as exc:
        read_state(built.spec, "savepoint:sp6")
    assert_names(exc, savepoint_metadata_key("sp6"))


# -- checkpoint metadata in the place of another -------------------------------------------------


def test_checkpoint_metadata_over_another_checkpoints_fails_load(built: Built) -> None:
    copy_over(built.spec, checkpoint_key(4), checkpoint_key(5))  # chk-5 <- chk-4
    with built.spec.open() as store, pytest.raises(CorruptionError) as exc:
        JobCatalog(store).load(5)
    assert_names(exc, checkpoint_key(5))
    assert "holds checkpoint 4" in str(exc.value)


def test_savepoint_metadata_over_its_checkpoints_fails_load(built: Built) -> None:
    """Same checkpoint id, but a savepoint's metadata is not a checkpoint's."""
    copy_over(built.spec, savepoint_metadata_key("sp6"), checkpoint_key(6))
    with built.spec.open() as store, pytest.raises(CorruptionError) as exc:
        JobCatalog(store).load(6)
    assert_names(exc, checkpoint_key(6))
    assert "savepoint" in str(exc.value)


# -- a table file in the place of another --------------------------------------------------------


def test_table_file_swapped_with_another_of_the_same_state_fails_restore(built: Built) -> None:
    path = swap_table_file(built)
    with pytest.raises(CorruptionError) as exc:
        read_state(built.spec, 6)
    assert_names(exc, path)


# -- the other readers ---------------------------------------------------------------------------


def test_materializer_fails_on_a_swapped_base_manifest(built: Built) -> None:
    copy_over(built.spec, m1(built), m2(built))
    with built.spec.open() as store, pytest.raises(CorruptionError) as exc:
        materialize(store, JobCatalog(store).load(6), options=OPTIONS)
    assert_names(exc, m2(built))


def test_savepoint_creation_fails_on_a_swapped_base_manifest(built: Built) -> None:
    copy_over(built.spec, m1(built), m2(built))
    with built.spec.open() as store, pytest.raises(CorruptionError) as exc:
        create_savepoint(store, 6, "sp-after", options=OPTIONS)
    assert_names(exc, m2(built))


def test_spark_state_reader_fails_on_a_swapped_manifest(built: Built) -> None:
    copy_over(built.spec, m1(built), m2(built))
    with built.spec.open() as store:
        meta = JobCatalog(store).load(6)
        with pytest.raises(CorruptionError) as exc:
            read_state_changes(store, meta.operators["counter"], "count", KeyGroupRange(0, MAXP - 1))
    assert_names(exc, m2(built))


def test_gc_deletes_no_table_file_when_a_manifest_is_swapped(built: Built) -> None:
    copy_over(built.spec, m1(built), m2(built))
    with built.spec.open() as store:
        before = {o.key for o in store.list("materializations/data/")}
        report = collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR)
        after = {o.key for o in store.list("materializations/data/")}
    assert not report.ok
    assert any(m2(built) in e for e in report.errors), report.errors
    assert after == before  # with M1's file list in M2's place, M2's own files would have gone


# -- objects written before the binding ----------------------------------------------------------


def strip_binding(body: dict[str, Any]) -> None:
    body.pop("savepoint", None)
    for op in body["operators"].values():
        for h in op["subtasks"]:
            for p in h["materialization"]:
                p.pop("bytes", None)
                p.pop("crc32", None)


def test_objects_without_the_new_fields_still_read(built: Built) -> None:
    with built.spec.open() as store:
        chk = store.get(checkpoint_key(6))
        sp = store.get(savepoint_metadata_key("sp6"))
        spm = store.get(savepoint_manifest_key("sp6"))
    overwrite(built.spec, checkpoint_key(6), rewrap(chk, strip_binding))
    overwrite(built.spec, savepoint_metadata_key("sp6"), rewrap(sp, strip_binding))
    overwrite(built.spec, savepoint_manifest_key("sp6"), rewrap(spm, lambda body: body.pop("savepoint")))
    with built.spec.open() as store:
        meta = JobCatalog(store).load(6)
        assert all(p.bytes is None for op in meta.operators.values() for h in op.subtasks for p in h.materialization)
        assert load_savepoint(store, "sp6").savepoint is None
        assert load_manifest(store, savepoint_manifest_key("sp6")).savepoint is None
    assert read_state(built.spec, 6) == built.expected[6]
    assert read_state(built.spec, "savepoint:sp6") == built.expected[6]
    # without the binding, the identity check still catches a manifest in the wrong place
    copy_over(built.spec, m1(built), m2(built))
    with pytest.raises(CorruptionError) as exc:
        read_state(built.spec, 6)
    assert_names(exc, m2(built))


def test_new_metadata_roundtrips(built: Built) -> None:
    with built.spec.open() as store:
        sp = load_savepoint(store, "sp6")
        assert CheckpointMetadata.from_bytes(sp.to_bytes(), savepoint_metadata_key("sp6")) == sp
        m = load_manifest(store, savepoint_manifest_key("sp6"))
        again = Manifest.from_bytes(m.to_bytes(), m.key)
        assert again == m and (again.object_bytes, again.object_crc32) == (m.object_bytes, m.object_crc32)
