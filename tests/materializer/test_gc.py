"""Garbage collection (materializer/gc/, `statelog gc`) on file:// and on SeaweedFS.

Every test builds a real job (changelog segments, checkpoints, materializations adopted by the
backends) and checks after GC that each retained checkpoint and savepoint still restores to
the state a model predicts, and that `statelog verify` finds no fault.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.build import MaterializeOptions, materialize
from materializer.gc.collect import collect_garbage
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError, JobNotFoundError
from statelog.layout import checkpoint_key
from statelog.materialization.manifest import (
    Manifest,
    latest_manifest_key,
    list_manifests,
    load_manifest,
)
from statelog.store.base import ObjectStore
from statelog.testing import FaultInjectingStore
from tests.support.s3server import RootSpec
from tools.cli import main

MAXP = 32
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
EVENTS = ListStateDescriptor("events", pa.string())
ATTRS = MapStateDescriptor("attrs", pa.int64(), key_type=pa.string())
KEYS = [f"user-{i}" for i in range(32)]
OPTIONS = MaterializeOptions(units=8)  # few, larger files: fast tests, yet files are reused
FAR = 10 * 86400.0  # "now" this far ahead makes every object older than any grace period


# -- a job with checkpoints and adopted materializations, and a model of its state ---------------


@dataclass
class Built:
    spec: RootSpec
    metas: dict[int, CheckpointMetadata] = field(default_factory=dict)
    expected: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)  # cid -> state
    manifests: dict[int, Manifest] = field(default_factory=dict)  # checkpoint id -> its materialization


def empty_model() -> dict[str, dict[str, Any]]:
    return {"count": {}, "events": {}, "attrs": {}}


def copy_model(m: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        "count": dict(m["count"]),
        "events": {k: list(v) for k, v in m["events"].items()},
        "attrs": {k: dict(v) for k, v in m["attrs"].items()},
    }


def touched(round_: int) -> list[str]:
    """All keys in the first two rounds, then an eighth of them (untouched files get reused)."""
    return KEYS if round_ < 2 else [k for i, k in enumerate(KEYS) if i % 8 == round_ % 8]


def build(
    spec: RootSpec,
    rounds: int = 6,
    materialize_after: tuple[int, ...] = (2, 4),
    *,
    built: Built | None = None,
    model: dict[str, dict[str, Any]] | None = None,
    first_round: int = 0,
) -> Built:
    """Operators ``counter`` (parallelism 2: count) and ``sessions`` (1: events, attrs).

    One checkpoint per round; after the checkpoints of ``materialize_after`` (1-based round
    numbers) a materialization is published, which the backends adopt at the next checkpoint.
    """
    out = built or Built(spec)
    model = model if model is not None else empty_model()
    job = statelog.open(spec.url, store_options=dict(spec.options), max_parallelism=MAXP, retain_checkpoints=50)
    job.materialization_poll_s = 0
    try:
        last = job.latest_checkpoint()
        counters = [job.backend("counter", subtask=i, parallelism=2, restore=last) for i in range(2)]
        sessions = job.backend("sessions", restore=last)
        # restores are on demand: a backend adopts no materialization while key groups are
        # still loading (it needs the restored handles), so the checkpoints whose references
        # these tests check would depend on the background loader's pace
        for b in (*counters, sessions):
            b.wait_loaded()
        for round_ in range(first_round, first_round + rounds):
            for key in touched(round_):
                c = counters[statelog.subtask_for_key_group(MAXP, 2, statelog.key_group_of(key, MAXP))]
                c.set_current_key(key)
                count = c.get_state(COUNT)
                count.update(count.value() + round_ + 1)
                model["count"][key] = model["count"].get(key, 0) + round_ + 1
                sessions.set_current_key(key)
                sessions.get_state(EVENTS).add(f"e{round_}")
                model["events"].setdefault(key, []).append(f"e{round_}")
                sessions.get_state(ATTRS).put("round", round_)
                model["attrs"].setdefault(key, {})["round"] = round_
            meta = job.checkpoint(sources={"events": (round_ + 1) * 100})
            out.metas[meta.checkpoint_id] = meta
            out.expected[meta.checkpoint_id] = copy_model(model)
            if round_ + 1 in materialize_after:
                out.manifests[meta.checkpoint_id] = materialize(job.store, meta, options=OPTIONS)
    finally:
        job.close()
    return out


def read_state(spec: RootSpec, restore: Any, parallelism: int = 2) -> dict[str, dict[str, Any]]:
    """The logical state of both operators at ``restore``, read through ``parallelism`` subtasks."""
    job = statelog.open(spec.url, store_options=dict(spec.options), create=False)
    state = empty_model()
    try:
        for i in range(parallelism):
            b = job.backend("counter", subtask=i, parallelism=parallelism, restore=restore, changelog=False)
            b.get_state(COUNT)
            state["count"].update((k, v) for k, _ns, v in b.entries("count"))
        for i in range(parallelism):
            b = job.backend("sessions", subtask=i, parallelism=parallelism, restore=restore, changelog=False)
            b.get_state(EVENTS)
            b.get_state(ATTRS)
            state["events"].update((k, list(v)) for k, _ns, v in b.entries("events"))
            state["attrs"].update((k, dict(v)) for k, _ns, v in b.entries("attrs"))
    finally:
        job.close()
    return state


def assert_restorable(built: Built, cids: list[int] | None = None) -> None:
    """Every retained checkpoint (or ``cids``) restores to the model's state; verify is clean."""
    with built.spec.open() as store:
        retained = JobCatalog(store).checkpoint_ids()
    for cid in cids if cids is not None else retained:
        assert read_state(built.spec, cid) == built.expected[cid], f"checkpoint {cid}"
    assert verify(built.spec) == 0


def cli_args(spec: RootSpec) -> list[str]:
    args = []
    for k, v in spec.options.items():
        args += ["--store-option", f"{k}={v}"]
    return args


def verify(spec: RootSpec) -> int:
    return main(["verify", spec.url, *cli_args(spec)])


def listing(store: ObjectStore, prefix: str = "") -> dict[str, float]:
    return {o.key: o.mtime for o in store.list(prefix)}


def reachable(store: ObjectStore, cids: list[int]) -> set[str]:
    """Test oracle: every object the given checkpoints and the newest materialization reach."""
    out: set[str] = set()
    catalog = JobCatalog(store)
    manifests = set()
    for cid in cids:
        meta = catalog.load(cid)
        out |= meta.segment_names()
        manifests |= meta.manifest_keys()
    newest = latest_manifest_key(store)
    if newest:
        manifests.add(newest)
    for key in manifests:
        out.add(key)
        out |= load_manifest(store, key).paths()
    return out


def gc_scope(keys: Any) -> set[str]:
    return {k for k in keys if k.startswith(("changelog/", "materializations/"))}


def orphan(store: ObjectStore, tag: str) -> list[str]:
    """Leftovers: a segment of a dead writer, files of a materialization without manifest."""
    keys = [
        f"changelog/0000000000000-{tag:0>12}/0000000000.seg",
        f"materializations/data/m-000000000099-000000-{tag:0>8}/000-count-00000000-kg00000-00001.parquet",
    ]
    for k in keys:
        store.put(k, b"leftover " + tag.encode())
    return keys


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
        "savepoints/half-done/data/m-000000000001-000000-00000000/x.parquet",
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
