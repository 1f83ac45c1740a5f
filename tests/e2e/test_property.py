"""Property test: random operations over all state kinds, random checkpoints and random
crashes (in-memory state and unflushed buffers dropped); every restore equals the model."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statelog
from statelog import StateJob
from statelog.restore.ondemand.options import OnDemandOptions
from tests.support.chaos import damage_copies
from tests.support.harness import Clock, Driver, Model
from tests.support.state_ops import BATCH_OPS, DISK_CACHE_ENTRIES, MODES, STATE_OPS, is_lazy

OPS = st.one_of(  # nested one_of is flattened: every operation keeps its weight
    STATE_OPS,
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("snap")),
    st.tuples(st.just("complete")),
    st.tuples(st.just("crash"), st.integers(0, 3), st.booleans()),
)


ON_DEMAND = OnDemandOptions()  # the on-demand restore options of the jobs (reads_alone sets them)


def reads_alone(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """``touched`` modes: a touched key group reads its records of the tail alone (its blocks
    of each segment); ``on-demand``: the tail, small here, is read whole by the first touch
    (and a state without table files is installed at once)."""
    if mode.endswith("touched"):
        monkeypatch.setattr(sys.modules[__name__], "ON_DEMAND", OnDemandOptions(segment_read_cost_bytes=0))


def open_job(root: str, options: dict, writer_options: dict | None = None, on_demand: str = "eager",
             copies: Path | None = None) -> StateJob:  # fmt: skip
    """A job of restore mode ``on_demand`` (:data:`MODES`), with local copies in ``copies``."""
    job = statelog.open(root, store_options=options, writer_options=writer_options, retain_checkpoints=3,
                        on_demand_restore=is_lazy(on_demand),
                        state_store="disk" if on_demand.startswith("disk") else "memory",
                        local_copies=None if copies is None else {"directory": str(copies)})  # fmt: skip
    job.on_demand_background = not on_demand.endswith("touched")
    job.on_demand_options = ON_DEMAND
    job.state_cache_entries = DISK_CACHE_ENTRIES
    return job


def run_scenario(root: str, options: dict, ops: list[tuple], coalesce: bool, mode: str = "eager",
                 persist_delay: float = 0.002, copies: Path | None = None, damage: str | None = None,
                 copy_stats: list[tuple[int, int]] | None = None, **writer: int) -> int:  # fmt: skip
    """Run ``ops``; on each crash restore a random retained checkpoint and compare. Returns #restores.

    ``copies``: the jobs keep local copies there; ``damage`` (``"flip"``, ``"truncate"``):
    every copy is damaged so before each restore; ``copy_stats`` collects each job's hits and
    misses of the copies.

    Eager restores are compared at once; on-demand ones first process the next operations
    (loading the key groups they touch) and are compared at the next crash or at the end,
    so checkpoints are taken while key groups are still unloaded."""
    clock = Clock()
    writer_options = {"coalesce": coalesce, "persist_delay": persist_delay, **writer}
    rng = random.Random(len(ops))

    def reopen(writer_options: dict | None) -> StateJob:
        if copy_stats is not None and job.local_copies is not None:
            copy_stats.append((job.local_copies.stats.hits, job.local_copies.stats.misses))
        if damage is not None and copies is not None:
            damage_copies(copies, rng, damage)
        return open_job(root, options, writer_options, mode, copies)

    job = open_job(root, options, writer_options, mode, copies)
    model = Model()
    snapshots: dict[int, Model] = {}
    driver = Driver(job.backend("op", clock=clock), model, clock)
    driver.set_key(0)
    restores = 0
    pending = None  # (checkpoint id, PendingSnapshot, model copy): sync part done, async not
    for op in ops:
        if op[0] in ("checkpoint", "complete") and pending is not None:
            cid, snap, snap_model = pending
            job.publish_checkpoint(cid, [snap.result(30)], {"offset": len(snapshots)})
            snapshots[cid] = snap_model
            pending = None
        if op[0] == "checkpoint":
            meta = job.checkpoint(sources={"offset": len(snapshots)})
            snapshots[meta.checkpoint_id] = driver.model.copy()
        elif op[0] == "snap":
            if pending is None:
                # only the synchronous part: processing goes on while the upload completes
                cid = job.next_checkpoint_id()
                pending = (cid, driver.backend.snapshot(cid), driver.model.copy())
        elif op[0] == "complete":
            pass
        elif op[0] == "crash":
            _, pick, wait_flush = op
            if pending is not None:
                pending[1].cancel()  # the checkpoint is aborted by the failure
                pending = None
            if is_lazy(mode):
                driver.check_equal()  # the state restored on demand, plus what followed
            if wait_flush:
                job.writer.flush()  # everything durable, but no checkpoint references the tail
            job.close(flush=False)  # crash: buffered records and in-memory state are gone
            job = reopen(writer_options)
            retained = job.catalog.checkpoint_ids()
            assert set(retained) <= set(snapshots)
            if retained:
                cid = retained[-1 - min(pick, len(retained) - 1)]
                meta = job.load_checkpoint(cid)
                assert meta.sources["offset"] >= 0
                model = snapshots[cid].copy()
            else:
                meta, model = None, Model()
            driver = Driver(job.backend("op", restore=meta, clock=clock), model, clock)
            if not is_lazy(mode):
                driver.check_equal()
            restores += 1
            driver.set_key(0)
        else:
            driver.apply(op)
    # the final state restored from a final checkpoint equals the model
    if pending is not None:
        cid, snap, snap_model = pending
        job.publish_checkpoint(cid, [snap.result(30)], {"offset": len(snapshots)})
    meta = job.checkpoint(sources={})
    final = driver.model.copy()
    driver.check_equal()
    job.close(flush=False)
    job = reopen(None)
    restored = Driver(job.backend("op", restore=meta.checkpoint_id, clock=clock), final, clock)
    restored.check_equal()
    job.close()
    if copy_stats is not None and job.local_copies is not None:
        copy_stats.append((job.local_copies.stats.hits, job.local_copies.stats.misses))
    return restores


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=5, max_size=120), coalesce=st.booleans())
@pytest.mark.parametrize("mode", MODES)
def test_restore_equals_model_file(tmp_path_factory, monkeypatch, ops, coalesce, mode):
    reads_alone(monkeypatch, mode)
    root = tmp_path_factory.mktemp("prop").as_uri()
    run_scenario(root, {}, ops, coalesce, mode)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=20, max_size=120), coalesce=st.booleans())
@pytest.mark.parametrize("damage", [None, "flip", "truncate"], ids=["intact", "flipped", "truncated"])
@pytest.mark.parametrize("mode", ["eager", "on-demand"])
def test_restore_equals_model_with_local_copies(tmp_path_factory, monkeypatch, ops, coalesce, mode, damage):
    """Every job keeps local copies; ``flipped``/``truncated``: before each restore every copy
    is damaged (its record kept), so restores drop them and read the store."""
    reads_alone(monkeypatch, mode)
    base = tmp_path_factory.mktemp("prop")
    stats: list[tuple[int, int]] = []
    run_scenario((base / "root").as_uri(), {}, ops, coalesce, mode, copies=base / "copies", damage=damage,
                 copy_stats=stats)  # fmt: skip
    assert stats
    if damage is None:  # every object the jobs read, one of them wrote on this host
        assert all(misses == 0 for _hits, misses in stats), stats


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=60, max_size=160), coalesce=st.booleans())  # segments of several keys
@pytest.mark.parametrize("mode", ["eager", "touched", "disk-touched"])
def test_restore_equals_model_with_streams_split_by_key_group(tmp_path_factory, monkeypatch, ops, coalesce, mode):
    """Segment version 2 everywhere: a stream with two records or more in a segment is split
    into a block per key group (format.md 4.2), which restores and touches read; segments
    flushed only at checkpoints and crashes, so that they hold records of several keys."""
    reads_alone(monkeypatch, mode)
    root = tmp_path_factory.mktemp("prop").as_uri()
    run_scenario(root, {}, ops, coalesce, mode, persist_delay=60.0, split_min_rows=2, split_block_rows=1)


@pytest.mark.slow
@pytest.mark.s3
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=5, max_size=80), coalesce=st.booleans())
@pytest.mark.parametrize("mode", ["eager", "on-demand", "disk"])
def test_restore_equals_model_s3(s3_server, ops, coalesce, mode):
    spec = s3_server.unique_root()
    run_scenario(spec.url, spec.options, ops, coalesce, mode)


# single and batch calls (statelog/state/batch.py) interleaved
BATCH_MIX = st.one_of(OPS, BATCH_OPS, BATCH_OPS)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(BATCH_MIX, min_size=5, max_size=100), coalesce=st.booleans())
@pytest.mark.parametrize("mode", MODES)
def test_single_and_batch_calls_restore_equals_model(tmp_path_factory, monkeypatch, ops, coalesce, mode):
    reads_alone(monkeypatch, mode)
    root = tmp_path_factory.mktemp("prop").as_uri()
    run_scenario(root, {}, ops, coalesce, mode)
