"""The restore/rescale job: state written at p=2 and restored at p=3, 1 and 4 from a retained
checkpoint that is not the latest has the same logical content, laid out so that each new
subtask reads only its own files; drop and rename; clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.checkpoint.catalog import load_savepoint
from statelog.errors import CheckpointNotFoundError, ConfigError, StateNotFoundError
from statelog.keys.groups import key_group_range_for_subtask
from statelog.layout import savepoint_manifest_key
from statelog.materialization.manifest import load_manifest
from statelog.spark.rescale.driver import restore
from statelog.store import open_store
from statelog.testing import FaultInjectingStore
from tests.support.spark import jobs


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> jobs.Built:
    """The jobs.build job in a root of its own (these tests add savepoints)."""
    return jobs.build((tmp_path_factory.mktemp("rescale") / "root").as_uri(), {}, seed=11)


def _restore_all(root: str, which: str, uid: str, state: str, parallelism: int) -> set[tuple]:
    job = statelog.open(root, create=False)
    try:
        return jobs.restored_rows(job, which, state, parallelism, uid)
    finally:
        job.close()


def _reads_of_subtask(root: str, which: str, subtask: int, parallelism: int) -> list[str]:
    """Object keys a restore of one new subtask (every state registered) reads."""
    inner = open_store(root)
    store = FaultInjectingStore(inner)
    keys: list[str] = []
    store.before("get", lambda _op, key: keys.append(key))
    store.before("get_range", lambda _op, key: keys.append(key))
    job = statelog.StateJob(root, store=store, create=False)
    try:
        b = job.backend("op", subtask=subtask, parallelism=parallelism, restore=which, changelog=False)
        for d in jobs.DESCRIPTORS:
            b.get_state(d)
        b.wait_loaded()  # (an on-demand restore reads the tables as key groups load)
    finally:
        job.close()
    return keys


@pytest.mark.parametrize("parallelism", [3, 1, 4])
def test_rescale_golden(spark: Any, written: jobs.Built, parallelism: int) -> None:
    b = written
    root = b.root
    job = statelog.open(root, create=False)
    latest = job.latest_checkpoint()
    job.close()
    assert latest is not None and latest.checkpoint_id == b.c4 != b.c3  # restore a checkpoint that is not the latest
    progress: list[tuple[int, int]] = []
    name = f"p{parallelism}"
    result = restore(spark, root, b.c3, parallelism=parallelism, savepoint=name,
                     progress=lambda d, t: progress.append((d, t)))
    assert result.tasks == 2 * parallelism and progress[-1] == (2 * parallelism, 2 * parallelism)
    store = open_store(root)
    try:
        sp = load_savepoint(store, name)
        c3 = statelog.StateJob(root, store=store, create=False).load_checkpoint(b.c3)
        manifest = load_manifest(store, savepoint_manifest_key(name))
    finally:
        store.close()
    # savepoint metadata: the checkpoint's id, sources and max_parallelism, handles for the new parallelism
    assert (sp.kind, sp.checkpoint_id, sp.max_parallelism, sp.sources) == ("savepoint", b.c3, jobs.MAXP, c3.sources)
    assert manifest.kind == "savepoint" and manifest.checkpoint_id == b.c3
    for uid in ("op", "words"):
        op = sp.operators[uid]
        assert op.parallelism == parallelism and len(op.subtasks) == parallelism
        for i, h in enumerate(op.subtasks):
            kgr = key_group_range_for_subtask(jobs.MAXP, parallelism, i)
            assert (h.subtask, h.parallelism, h.key_groups, h.changelog) == (i, parallelism, kgr, ())
            assert [(p.manifest, p.key_groups) for p in h.materialization] == [(manifest.key, kgr)]
        # every file lies inside one new subtask's key groups
        for fs in manifest.operators[uid].files.values():
            for f in fs:
                owner = statelog.subtask_for_key_group(jobs.MAXP, parallelism, f.key_groups.start)
                kgr = key_group_range_for_subtask(jobs.MAXP, parallelism, owner)
                assert kgr.start <= f.key_groups.start and f.key_groups.end <= kgr.end, f
    # the same logical content, state by state (the reference: a restore of checkpoint c3 at p=1)
    for state in jobs.STATES:
        assert _restore_all(root, f"savepoint:{name}", "op", state, parallelism) == \
            _restore_all(root, b.c3, "op", state, 1), state
    job = statelog.open(root, create=False)
    try:
        back = job.backend("words", subtask=0, parallelism=parallelism, restore=f"savepoint:{name}", changelog=False)
        assert back.state_infos()
    finally:
        job.close()
    # each new subtask reads only its own files (and no changelog)
    paths = {f.path: f for fs in manifest.operators["op"].files.values() for f in fs}
    for i in range(parallelism):
        kgr = key_group_range_for_subtask(jobs.MAXP, parallelism, i)
        keys = _reads_of_subtask(root, f"savepoint:{name}", i, parallelism)
        tables = [k for k in keys if k.endswith(".parquet")]
        assert not [k for k in keys if k.startswith("changelog/")]
        assert tables and all(k in paths for k in tables)
        assert all(kgr.start <= paths[k].key_groups.start and paths[k].key_groups.end <= kgr.end for k in tables)
        own = {p for p, f in paths.items() if kgr.start <= f.key_groups.start and f.key_groups.end <= kgr.end}
        assert set(tables) == own


def test_a_job_resumes_from_the_rescaled_savepoint(spark: Any, written: jobs.Built) -> None:
    """Subtasks restored from the savepoint write on, checkpoint, and restore again."""
    b = written
    restore(spark, b.root, b.c3, parallelism=3, savepoint="resume")
    job = statelog.open(b.root, create=False)
    job.materialization_poll_s = 0
    try:
        backends = [job.backend("op", subtask=i, parallelism=3, restore="savepoint:resume") for i in range(3)]
        job.backend("words", restore="savepoint:resume")
        states = [bk.get_state(jobs.descriptor("count")) for bk in backends]
        for key in ("user-1", "user-2", 5):
            i = statelog.subtask_for_key_group(jobs.MAXP, 3, statelog.key_group_of(key, jobs.MAXP))
            backends[i].set_current_key(key)
            states[i].set_namespace(None)
            states[i].update(states[i].value() + 100)
        meta = job.checkpoint(sources={"offset": 99})
        assert {p.manifest for h in meta.operators["op"].subtasks for p in h.materialization} == \
            {savepoint_manifest_key("resume")}
    finally:
        job.close()
    before = {r[:2]: r[2] for r in _restore_all(b.root, b.c3, "op", "count", 1)}
    after = {r[:2]: r[2] for r in _restore_all(b.root, meta.checkpoint_id, "op", "count", 2)}
    from statelog.keys.encoding import encode_key

    for key in ("user-1", "user-2", 5):
        k = (encode_key(key), encode_key(None))
        assert after.pop(k) == before.pop(k, 0) + 100
    assert after == before


def test_drop_and_rename_operators(spark: Any, written: jobs.Built) -> None:
    b = written
    result = restore(spark, b.root, str(b.c2), parallelism=2, savepoint="renamed", drop=["words"],
                     rename={"op": "counter"})
    assert result.dropped == ["words"] and set(result.operators) == {"counter"}
    assert result.operators["counter"]["from"] == "op"
    store = open_store(b.root)
    try:
        sp = load_savepoint(store, "renamed")
    finally:
        store.close()
    assert set(sp.operators) == {"counter"}
    for state in ("count", "ttl_m", "__timers_event"):
        assert _restore_all(b.root, "savepoint:renamed", "counter", state, 2) == \
            _restore_all(b.root, b.c2, "op", state, 2), state


def test_invalid_restore_arguments_fail_clearly(spark: Any, written: jobs.Built, tmp_path: Path) -> None:
    b = written
    for p in (0, 17):
        with pytest.raises(ConfigError, match=rf"parallelism {p} is outside 1..16"):
            restore(spark, b.root, b.c3, parallelism=p, savepoint="bad")
    with pytest.raises(StateNotFoundError, match=r"operator 'nope' does not exist in checkpoint 3 \(operators: op, words\)"):
        restore(spark, b.root, b.c3, drop=["nope"], savepoint="bad")
    with pytest.raises(ConfigError, match=r"would be used twice"):
        restore(spark, b.root, b.c3, rename={"op": "words"}, savepoint="bad")
    with pytest.raises(ConfigError, match=r"every operator of checkpoint 3 would be dropped"):
        restore(spark, b.root, b.c3, drop=["op", "words"], savepoint="bad")
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoint 99 does not exist"):
        restore(spark, b.root, 99, savepoint="bad")
    with pytest.raises(ConfigError, match=r"invalid savepoint name"):
        restore(spark, b.root, b.c3, savepoint="../x")
    store = open_store(b.root)
    try:
        assert not list(store.list("savepoints/bad/"))  # nothing was written
        store.put("savepoints/taken/data/x.parquet", b"leftover")
    finally:
        store.close()
    with pytest.raises(ConfigError, match=r"savepoint name 'taken' is in use"):
        restore(spark, b.root, b.c3, savepoint="taken")
