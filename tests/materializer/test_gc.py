"""Garbage collection (materializer/gc/, `statelog gc`) on file:// and on SeaweedFS.

Every test builds a real job (changelog segments, checkpoints, materializations adopted by the
backends) and checks after GC that each retained checkpoint and savepoint still restores to
the state a model predicts, and that `statelog verify` finds no fault.
"""

from __future__ import annotations

import json
import time

import pytest

import statelog
from materializer.build import materialize
from materializer.gc.collect import collect_garbage
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError, JobNotFoundError
from statelog.layout import checkpoint_key
from statelog.materialization.manifest import (
    list_manifests,
    load_manifest,
)
from statelog.testing import FaultInjectingStore
from tests.support.gc_job import (
    FAR,
    OPTIONS,
    assert_restorable,
    build,
    cli_args,
    gc_scope,
    listing,
    orphan,
    reachable,
    read_state,
)
from tests.support.s3server import RootSpec
from tools.cli import main

# -- GC rules ------------------------------------------------------------------------------------


def test_gc_deletes_exactly_the_unreachable_objects_older_than_grace(store_root: RootSpec) -> None:
    built = build(store_root)
    assert any(m.stats["files_reused"] > 0 for m in built.manifests.values()), "no incremental reuse"
    with store_root.open() as store:
        old_orphans = orphan(store, "a1")
        time.sleep(1.1)  # mtimes on S3 have second resolution
        young_orphans = orphan(store, "b2")
        before = listing(store)
        sizes = {o.key: o.size for o in store.list()}
        old_max = max(t for k, t in before.items() if k not in young_orphans)
        young_min = min(before[k] for k in young_orphans)
        assert old_max < young_min
        grace = 600.0
        now = (old_max + young_min) / 2 + grace
        ids = JobCatalog(store).checkpoint_ids()
        retained = ids[-2:]
        expected = gc_scope(before) - reachable(store, retained) - set(young_orphans)
        assert set(old_orphans) <= expected
        # what the retained checkpoints no longer need: old segments, the first materialization
        first_manifest = built.manifests[2].key
        assert first_manifest in expected

        report = collect_garbage(store, retain_checkpoints=2, grace_s=grace, now=now)
        after = listing(store)

    assert report.ok, report.errors
    assert report.checkpoints_deleted == tuple(ids[:-2])
    assert report.checkpoints_retained == tuple(retained)
    assert set(report.deleted_keys) == expected
    assert set(before) - set(after) == expected | {checkpoint_key(c) for c in ids[:-2]}
    assert set(young_orphans) <= set(after)
    assert report.protected["segments"].objects == 1 and report.protected["table_files"].objects == 1
    assert report.deleted["segments"].objects == len([k for k in expected if k.startswith("changelog/")])
    assert report.deleted["manifests"].objects == 1
    assert report.bytes_deleted == sum(sizes[k] for k in expected)
    # the newest materialization reuses files of the first one: those survive its manifest
    newest = built.manifests[4]
    reused = newest.paths() - {p for p in newest.paths() if p.startswith(f"materializations/data/{newest.mid}/")}
    assert reused and reused <= set(after)
    assert_restorable(built)

    # once the grace period has passed, the young leftovers go too
    with store_root.open() as store:
        later = collect_garbage(store, grace_s=grace, now=max(after.values()) + grace + 1)
        assert set(later.deleted_keys) == set(young_orphans)
        assert not set(young_orphans) & set(listing(store))
    assert_restorable(built)


def test_young_leftovers_survive_until_grace_passes(file_root: RootSpec) -> None:
    store_root = file_root
    built = build(store_root, rounds=3, materialize_after=(2,))
    with store_root.open() as store:
        leftovers = orphan(store, "c3")
        mtimes = listing(store).values()
        oldest, newest = min(mtimes), max(mtimes)
        first = collect_garbage(store, retain_checkpoints=1, grace_s=600, now=time.time())
        assert first.deleted_keys == ()  # everything is younger than 10 minutes
        assert first.checkpoints_deleted == (1, 2)
        assert first.protected["segments"].objects >= 2  # old segments and the dead writer's
        assert set(leftovers) <= set(listing(store))
        second = collect_garbage(store, grace_s=600, now=oldest + 599)
        assert second.deleted_keys == ()
        third = collect_garbage(store, grace_s=600, now=newest + 601)
        assert set(leftovers) <= set(third.deleted_keys)
        assert not set(leftovers) & set(listing(store))
    assert_restorable(built)


def test_recently_superseded_materialization_is_protected(store_root: RootSpec) -> None:
    """A backend may adopt a materialization it listed right before a newer one appeared."""
    built = build(store_root, rounds=2, materialize_after=())
    with store_root.open() as store:
        m1 = materialize(store, built.metas[1], options=OPTIONS)  # no checkpoint ever references it
        time.sleep(1.1)
        m2 = materialize(store, built.metas[2], options=OPTIONS)
        mtimes = listing(store, "materializations/")
        t2 = mtimes[m2.key]
        assert max(mtimes[k] for k in [m1.key, *m1.paths()]) < t2
        grace = 0.5
        protected = collect_garbage(store, grace_s=grace, now=t2 + 0.25)
        assert protected.deleted_keys == ()
        assert protected.protected["manifests"].objects == 1
        assert protected.protected["table_files"].objects == len(m1.paths())
        later = collect_garbage(store, grace_s=grace, now=t2 + 1.0)
        assert set(later.deleted_keys) == {m1.key, *m1.paths()}
        assert store.exists(m2.key) and all(store.exists(p) for p in m2.paths())
    assert_restorable(built)


def test_checkpoint_published_during_gc_keeps_what_it_references(store_root: RootSpec) -> None:
    """The rescan: a checkpoint published after the scan that builds on an old materialization."""
    built = build(store_root)  # checkpoint 3 builds on the materialization of 2, 5 and 6 on that of 4
    old = built.manifests[2]
    # a second process restored checkpoint 3 before GC started, and checkpoints during GC
    job2 = statelog.open(store_root.url, store_options=dict(store_root.options))
    backends = [job2.backend("counter", subtask=i, parallelism=2, restore=3) for i in range(2)]
    backends.append(job2.backend("sessions", restore=3))
    published: list[CheckpointMetadata] = []

    def publish_during_listing(op: str, prefix: str) -> None:
        if prefix == "materializations/" and not published:
            published.append(job2.checkpoint(sources={"events": 300}))

    inner = store_root.open()
    store = FaultInjectingStore(inner)
    store.after("list", publish_during_listing)
    try:
        report = collect_garbage(store, retain_checkpoints=1, grace_s=600, now=time.time() + FAR)
    finally:
        job2.close()
        store.close()
    assert published and published[0].checkpoint_id == 7
    assert old.key in published[0].manifest_keys()
    assert report.checkpoints_deleted == (1, 2, 3, 4, 5)
    assert old.key not in report.deleted_keys
    assert not (published[0].segment_names() | old.paths()) & set(report.deleted_keys)
    built.expected[7] = built.expected[3]
    assert_restorable(built, [6, 7])


def test_crash_at_any_point_leaves_retained_checkpoints_restorable(file_root: RootSpec) -> None:
    store_root = file_root
    built = build(store_root, rounds=5)
    with store_root.open() as store:
        orphan(store, "d4")

    class Crash(Exception):
        pass

    with store_root.open() as store:
        dry = collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR, dry_run=True)
    total = len(dry.checkpoints_deleted) + dry.objects_deleted  # deletions of a complete run
    assert dry.deleted["manifests"].objects == 1 and dry.deleted["table_files"].objects > 1
    step = max(1, total // 4)  # each run is killed after this many deletions, until one completes
    crashes = 0
    while True:
        inner = store_root.open()
        store = FaultInjectingStore(inner)
        count = [0]

        def crash_after(op: str, key: str, count: list[int] = count) -> None:
            count[0] += 1
            if count[0] > step:
                raise Crash(f"killed before deleting {key}")

        store.before("delete", crash_after)
        try:
            collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR)
            done = True
        except Crash:
            crashes += 1
            done = False
        finally:
            store.close()
        assert_restorable(built)  # checkpoint metadata went first: no existing checkpoint lost anything
        with store_root.open() as store:  # manifests went before their files: none is incomplete
            existing = set(listing(store))
            for key, *_ in list_manifests(store):
                assert load_manifest(store, key).paths() <= existing, key
        if done:
            break
    assert crashes >= 3
    with store_root.open() as store:
        final = collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR)
        assert final.objects_deleted == 0 and final.checkpoints_deleted == ()
        assert gc_scope(listing(store)) == reachable(store, JobCatalog(store).checkpoint_ids())


def test_gc_never_deletes_job_lease_savepoint_or_foreign_objects(file_root: RootSpec) -> None:
    build(file_root, rounds=2, materialize_after=())
    keep = [
        "materializer/lease/gen-000000000001.json",
        "notes/readme.txt",
        "checkpoints/not-a-checkpoint.json",
    ]
    with file_root.open() as store:
        for k in keep:
            store.put(k, b"x")
        report = collect_garbage(store, retain_checkpoints=1, grace_s=0, now=time.time() + FAR)
        assert report.checkpoints_deleted == (1,)
        for k in [*keep, "job.json"]:
            assert store.exists(k), k
        assert not any(k.startswith(("materializer/", "savepoints/", "notes/")) for k in report.deleted_keys)


def test_dry_run_deletes_nothing_and_reports_what_gc_would_delete(file_root: RootSpec) -> None:
    build(file_root, rounds=4, materialize_after=(2,))
    with file_root.open() as store:
        before = listing(store)
        now = time.time() + FAR
        dry = collect_garbage(store, retain_checkpoints=1, grace_s=60, now=now, dry_run=True)
        assert listing(store) == before
        real = collect_garbage(store, retain_checkpoints=1, grace_s=60, now=now)
    assert dry.dry_run and not real.dry_run
    assert dry.checkpoints_deleted == real.checkpoints_deleted == (1, 2, 3)
    assert dry.deleted_keys == real.deleted_keys and dry.deleted_keys
    assert dry.to_json()["deleted"] == real.to_json()["deleted"]


def test_unreadable_checkpoint_metadata_stops_data_deletion(file_root: RootSpec) -> None:
    store_root = file_root
    built = build(store_root, rounds=3, materialize_after=(2,))
    with store_root.open() as store:
        key = checkpoint_key(2)
        store.delete(key)
        store.put(key, b"{not json")
        before = listing(store)
        report = collect_garbage(store, grace_s=0, now=time.time() + FAR)
        assert listing(store) == before
    assert not report.ok and report.deleted_keys == ()
    assert any(key in e and "deleted no segment" in e for e in report.errors)
    assert read_state(store_root, 3) == built.expected[3]


def test_bad_arguments_are_config_errors(file_root: RootSpec) -> None:
    with file_root.open() as store:
        with pytest.raises(JobNotFoundError):
            collect_garbage(store)
        assert list(store.list()) == []  # nothing was created
    build(file_root, rounds=1, materialize_after=())
    with file_root.open() as store:
        for kwargs in ({"retain_checkpoints": 0}, {"retain_checkpoints": "2"}, {"grace_s": -1},
                       {"grace_s": float("nan")}, {"grace_s": True}):
            with pytest.raises(ConfigError):
                collect_garbage(store, **kwargs)


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_gc_json_dry_run_and_tables(store_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    built = build(store_root, rounds=4, materialize_after=(2,))
    args = cli_args(store_root)
    assert main(["gc", store_root.url, *args, "--grace", "0", "--retain", "1", "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and dry["checkpoints_deleted"] == [1, 2, 3] and dry["objects_deleted"] > 0
    assert dry["ok"] and set(dry["deleted"]) == {"segments", "manifests", "table_files", "other"}

    assert main(["gc", store_root.url, *args, "--grace", "0", "--retain", "1", "--json"]) == 0
    real = json.loads(capsys.readouterr().out)
    assert real["deleted_keys"] == dry["deleted_keys"] and real["checkpoints_retained"] == [4]
    assert "secret" not in json.dumps(real).lower()

    assert main(["gc", store_root.url, *args, "--grace", "1h"]) == 0
    out = capsys.readouterr().out
    assert "changelog segments" in out and "grace period 3600s" in out and "retained 4" in out
    assert_restorable(built)


BAD_GC_ARGUMENTS = [
    (["--grace", "ten minutes"], "--grace: invalid duration 'ten minutes'"),
    (["--grace=-5m"], "--grace: invalid duration '-5m'"),
    (["--grace", "5x"], "use a number with an optional unit"),
    (["--retain", "0"], "--retain: invalid count '0'"),
    (["--retain", "two"], "--retain: invalid count 'two'"),
]


def test_cli_gc_bad_input_exit_2(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    build(file_root, rounds=2, materialize_after=())
    with file_root.open() as store:
        before = listing(store)
    for argv, message in BAD_GC_ARGUMENTS:
        assert main(["gc", file_root.url, "--grace", "0", "--retain", "1", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("statelog: error: ") and message in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1
    with file_root.open() as store:
        assert listing(store) == before  # nothing deleted


def test_cli_gc_durations_and_missing_root(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.cli.maintenance import parse_duration

    assert [parse_duration(t) for t in ("0", "30s", "10m", "1h", "1.5h", "2d", "250ms", " 7 ")] == [
        0, 30, 600, 3600, 5400, 172800, 0.25, 7
    ]
    assert main(["gc", file_root.url]) == 2
    assert "not a statelog job root" in capsys.readouterr().err


def test_cli_gc_reports_errors_with_exit_1(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    build(file_root, rounds=2, materialize_after=())
    with file_root.open() as store:
        store.delete(checkpoint_key(1))
        store.put(checkpoint_key(1), b"garbage")
    assert main(["gc", file_root.url, "--grace", "0"]) == 1
    out = capsys.readouterr().out
    assert "ERROR checkpoint metadata checkpoints/chk-000000000001.json cannot be read" in out
