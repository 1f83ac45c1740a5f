"""Savepoints (materializer/savepoint.py, `statelog savepoint ...`) on file:// and on SeaweedFS."""

from __future__ import annotations

import json
import time

import pytest

import statelog
from materializer.gc.collect import collect_garbage
from materializer.savepoint import create_savepoint, delete_savepoint, list_savepoints
from statelog.checkpoint.catalog import JobCatalog, load_savepoint, savepoint_names
from statelog.errors import CheckpointNotFoundError, ConfigError, SavepointNotFoundError, StoreError
from statelog.layout import savepoint_manifest_key, savepoint_metadata_key
from statelog.materialization.manifest import load_manifest
from statelog.state_processor.progress import marker_key
from statelog.testing import FaultInjectingStore
from tests.support.gc_job import (
    ATTRS,
    COUNT,
    EVENTS,
    FAR,
    MAXP,
    OPTIONS,
    assert_restorable,
    build,
    cli_args,
    copy_model,
    listing,
    read_state,
    verify,
)
from tests.support.s3server import RootSpec
from tools.cli import main


def test_savepoint_layout_and_metadata(store_root: RootSpec) -> None:
    built = build(store_root, rounds=3, materialize_after=(2,))  # checkpoint 3 builds on a materialization
    with store_root.open() as store:
        sp = create_savepoint(store, 3, "before-upgrade", options=OPTIONS)
        original = built.metas[3]
        assert sp.kind == "savepoint" and sp.checkpoint_id == 3
        assert (sp.job_id, sp.max_parallelism, sp.sources) == (original.job_id, MAXP, original.sources)
        for uid, op in original.operators.items():
            handles = sp.operators[uid].subtasks
            assert [(h.subtask, h.parallelism, h.key_groups, h.states) for h in handles] == [
                (h.subtask, h.parallelism, h.key_groups, h.states) for h in op.subtasks
            ]
            for h in handles:
                assert h.changelog == ()
                assert [(p.manifest, p.key_groups) for p in h.materialization] == [
                    (savepoint_manifest_key("before-upgrade"), h.key_groups)
                ]
        assert load_savepoint(store, "before-upgrade") == sp
        manifest = load_manifest(store, savepoint_manifest_key("before-upgrade"))
        assert manifest.kind == "savepoint" and manifest.stats["files_reused"] == 0
        assert all(p.startswith("savepoints/before-upgrade/data/") for p in manifest.paths())
        keys = set(listing(store, "savepoints/"))
        assert keys == {savepoint_metadata_key("before-upgrade"), manifest.key, *manifest.paths()}
        [row] = list_savepoints(store)
        assert row["name"] == "before-upgrade" and row["checkpoint_id"] == 3
        assert (row["rows"], row["bytes"], row["files"]) == (manifest.rows, manifest.bytes, len(manifest.paths()))
        assert row["created"].endswith("Z") and row["created_ms"] >= original.timestamp_ms
    assert read_state(store_root, "savepoint:before-upgrade") == built.expected[3]
    assert verify(store_root) == 0


def test_a_creation_keeps_an_in_progress_marker_until_its_metadata_is_written(store_root: RootSpec) -> None:
    """GC collects what an unpublished savepoint left after the grace period; the creation's
    refreshed marker keeps its files young while it runs (and ages with them when it fails)."""
    build(store_root, rounds=2)
    with store_root.open() as inner:
        store = FaultInjectingStore(inner)
        seen: dict[str, list[str]] = {}

        def look(op: str, key: str) -> None:
            if key in (savepoint_manifest_key("sp"), savepoint_metadata_key("sp")):
                seen[key] = [k for k in listing(inner, "savepoints/sp/") if "/_writing-" in k]

        store.before("put", look)
        create_savepoint(store, 2, "sp", options=OPTIONS)
        assert seen[savepoint_manifest_key("sp")] == [marker_key("sp")]
        assert seen[savepoint_metadata_key("sp")] == [marker_key("sp")]
        assert not [k for k in listing(inner, "savepoints/sp/") if "/_writing-" in k]  # deleted once published
        store.reset()

        def refuse_metadata(op: str, key: str) -> None:
            if key == savepoint_metadata_key("failed"):
                raise StoreError("refused", key=key)

        store.before("put", refuse_metadata)
        with pytest.raises(StoreError, match="refused"):
            create_savepoint(store, 2, "failed", options=OPTIONS)
        assert marker_key("failed") in listing(inner, "savepoints/failed/")  # left to age with the files


def test_restore_from_savepoint_at_another_parallelism(store_root: RootSpec) -> None:
    built = build(store_root, rounds=4, materialize_after=(2,))
    with store_root.open() as store:
        create_savepoint(store, 4, "sp", options=OPTIONS)
    for parallelism in (1, 3, 8):  # the checkpoint was taken at parallelism 2 and 1
        assert read_state(store_root, "savepoint:sp", parallelism) == built.expected[4], parallelism


def test_savepoint_survives_gc_after_its_checkpoint_is_gone(store_root: RootSpec) -> None:
    built = build(store_root, rounds=3, materialize_after=(2,))
    with store_root.open() as store:
        create_savepoint(store, 2, "at-two", options=OPTIONS)  # built on the changelog only
        create_savepoint(store, 3, "at-three", options=OPTIONS)  # built on a materialization
    build(store_root, rounds=3, materialize_after=(5,), built=built, model=copy_model(built.expected[3]), first_round=3)
    with store_root.open() as store:
        sp_objects = set(listing(store, "savepoints/"))
        report = collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR)
        assert report.checkpoints_deleted == (1, 2, 3, 4, 5)
        assert report.savepoints == ("at-three", "at-two")
        assert report.objects_deleted > 0
        assert set(listing(store, "savepoints/")) == sp_objects
        assert JobCatalog(store).checkpoint_ids() == [6]
        # nothing of the job's changelog or materializations that checkpoints 2 and 3 used is left
        for cid in (2, 3):
            gone = built.metas[cid].segment_names() - built.metas[6].segment_names()
            assert gone and not gone & set(listing(store, "changelog/"))
    assert read_state(store_root, "savepoint:at-two", 3) == built.expected[2]
    assert read_state(store_root, "savepoint:at-three", 1) == built.expected[3]
    assert_restorable(built)  # checkpoint 6 and the savepoints (verify checks them too)


def test_job_restored_from_savepoint_and_delete_protection(store_root: RootSpec) -> None:
    built = build(store_root, rounds=2, materialize_after=())
    with store_root.open() as store:
        create_savepoint(store, 2, "base", options=OPTIONS)
    # a new run of the job restores the savepoint: its checkpoints build on the savepoint's image
    job = statelog.open(store_root.url, store_options=dict(store_root.options))
    try:
        counters = [job.backend("counter", subtask=i, parallelism=4, restore="savepoint:base") for i in range(4)]
        sessions = [job.backend("sessions", subtask=i, parallelism=2, restore="savepoint:base") for i in range(2)]
        for b in [*counters, *sessions]:
            for d in (COUNT,) if b.operator_uid == "counter" else (EVENTS, ATTRS):
                b.get_state(d)
        meta = job.checkpoint(sources={"events": 200})
    finally:
        job.close()
    assert meta.checkpoint_id == 3 and savepoint_manifest_key("base") in meta.manifest_keys()
    built.expected[3] = built.expected[2]
    with store_root.open() as store:
        collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR)
        with pytest.raises(ConfigError, match=r"retained checkpoint\(s\) 3 .*--force"):
            delete_savepoint(store, "base")
        assert savepoint_names(store) == ["base"]
    assert_restorable(built)
    assert read_state(store_root, 3, 1) == built.expected[2]
    with store_root.open() as store:
        result = delete_savepoint(store, "base", force=True)
        assert result["had_metadata"] and result["objects_deleted"] > 2
        assert list(store.list("savepoints/")) == []


def test_delete_removes_metadata_first(file_root: RootSpec) -> None:
    build(file_root, rounds=2, materialize_after=())
    with file_root.open() as inner:
        create_savepoint(inner, 1, "sp", options=OPTIONS)
        store = FaultInjectingStore(inner)
        deleted: list[str] = []

        def crash_after_first(op: str, key: str) -> None:
            deleted.append(key)
            if len(deleted) == 2:
                raise RuntimeError("killed")

        store.before("delete", crash_after_first)
        with pytest.raises(RuntimeError):
            delete_savepoint(store, "sp")
        assert deleted[0] == savepoint_metadata_key("sp")
        assert savepoint_names(inner) == [] and list_savepoints(inner) == []  # it no longer exists
        with pytest.raises(SavepointNotFoundError):
            load_savepoint(inner, "sp")
        # its leftovers block the name until they are removed
        with pytest.raises(ConfigError, match="has no metadata.*statelog savepoint delete ROOT sp"):
            create_savepoint(inner, 2, "sp")
        result = delete_savepoint(inner, "sp")
        assert not result["had_metadata"] and list(inner.list("savepoints/")) == []
        create_savepoint(inner, 2, "sp", options=OPTIONS)
    assert verify(file_root) == 0


def test_bad_savepoint_requests(file_root: RootSpec) -> None:
    build(file_root, rounds=2, materialize_after=())
    with file_root.open() as store:
        with pytest.raises(CheckpointNotFoundError, match=r"checkpoint 9 does not exist.*retained checkpoints: 1, 2"):
            create_savepoint(store, 9, "x")
        for name in ("", "../up", "a/b", ".hidden", "x" * 101, "spaces not allowed"):
            with pytest.raises(ConfigError, match="invalid savepoint name"):
                create_savepoint(store, 1, name)
        create_savepoint(store, 1, "taken", options=OPTIONS)
        with pytest.raises(ConfigError, match=r"savepoint 'taken' already exists .*\(of checkpoint 1\)"):
            create_savepoint(store, 2, "taken")
        with pytest.raises(SavepointNotFoundError, match=r"savepoint 'nope' does not exist .*savepoints: taken"):
            delete_savepoint(store, "nope")
        assert savepoint_names(store) == ["taken"]


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_savepoint_create_list_delete(store_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    built = build(store_root, rounds=2, materialize_after=())
    args = cli_args(store_root)
    assert main(["savepoint", "create", store_root.url, *args, "--checkpoint", "1", "--name", "one", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["name"] == "one" and created["checkpoint_id"] == 1 and created["rows"] > 0
    assert main(["savepoint", "create", store_root.url, *args, "--checkpoint", "latest", "--name", "two"]) == 0
    out = capsys.readouterr().out
    assert "savepoint two of checkpoint 2 created" in out and 'restore="savepoint:two"' in out

    assert main(["savepoint", "list", store_root.url, *args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["checkpoint_id"]) for r in rows] == [("one", 1), ("two", 2)]
    assert "secret" not in json.dumps(rows).lower()
    assert main(["savepoint", "list", store_root.url, *args]) == 0
    table = capsys.readouterr().out
    assert "Savepoints in" in table and "one" in table and "counter (p=2)" in table

    assert read_state(store_root, "savepoint:one") == built.expected[1]
    assert main(["savepoint", "delete", store_root.url, *args, "one", "--json"]) == 0
    deleted = json.loads(capsys.readouterr().out)
    assert deleted["name"] == "one" and deleted["had_metadata"] and deleted["objects_deleted"] >= 3
    assert main(["savepoint", "list", store_root.url, *args, "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["two"]
    assert verify(store_root) == 0


BAD_SAVEPOINT_REQUESTS = [
    (["create", "--checkpoint", "42", "--name", "x"], "checkpoint 42 does not exist"),
    (["create", "--checkpoint", "abc", "--name", "x"], '--checkpoint must be "latest", a checkpoint id'),
    (["create", "--checkpoint", "1", "--name", "bad/name"], "invalid savepoint name 'bad/name'"),
    (["create", "--checkpoint", "1", "--name", "dup"], "savepoint 'dup' already exists"),
    (["delete", "missing"], "savepoint 'missing' does not exist"),
    (["delete", "../x"], "invalid savepoint name"),
]


def test_cli_savepoint_bad_input_exit_2(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    build(file_root, rounds=1, materialize_after=())
    with file_root.open() as store:
        create_savepoint(store, 1, "dup", options=OPTIONS)
        before = set(listing(store))
    for argv, message in BAD_SAVEPOINT_REQUESTS:
        assert main(["savepoint", argv[0], file_root.url, *argv[1:]]) == 2, argv
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("statelog: error: ") and message in lines[0], err
    with file_root.open() as store:
        assert set(listing(store)) == before  # nothing written


def test_cli_savepoint_on_missing_root(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["savepoint", "list", file_root.url]) == 2
    assert "not a statelog job root" in capsys.readouterr().err
