"""Restore by key-group range and at another parallelism gives the same logical state."""

from __future__ import annotations

import random

import pytest

import statelog
from statelog.keys.groups import KeyGroupRange
from tests.support.harness import Clock, Driver, Model, backend_timers, backend_view, register_all


def _build(root: str, options: dict, parallelism: int, ops: int, seed: int):
    """Write state through ``parallelism`` subtasks (keys routed by key group); return meta + model."""
    rng = random.Random(seed)
    clock = Clock()
    job = statelog.open(root, store_options=options, max_parallelism=32)
    drivers = {}
    model = Model()
    for i in range(parallelism):
        drivers[i] = Driver(job.backend("op", subtask=i, parallelism=parallelism, clock=clock), model, clock)
    keys = [*range(60), *(f"user-{i}" for i in range(40)), *((i, "t") for i in range(10))]
    for n in range(ops):
        key = rng.choice(keys)
        kg = statelog.key_group_of(key, 32)
        d = drivers[statelog.subtask_for_key_group(32, parallelism, kg)]
        d.set_key(key)
        d.set_ns(rng.choice([None, (0, 10), (10, 20)]))
        d.apply(
            rng.choice(
                [
                    ("value_rmw", rng.randrange(10)),
                    ("list_add", f"e{n}"),
                    ("map_put", rng.choice("pqr"), n),
                    ("map_remove", rng.choice("pqr")),
                    ("sum", n % 7),
                    ("avg", n % 5),
                    ("obj", {"n": n}),
                    ("text", f"t{n}"),
                    ("timer_add", rng.choice(["event", "processing"]), rng.randrange(100)),
                    ("value_clear",),
                ]
            )
        )
        if n == ops // 2:
            job.checkpoint(sources={"offset": n})
    meta = job.checkpoint(sources={"offset": ops})
    job.close()
    return meta, model, clock


def _restore_view(job, meta, subtask, parallelism, clock):
    b = job.backend("op", subtask=subtask, parallelism=parallelism, restore=meta, clock=clock)
    states = register_all(b)
    return backend_view(b, states), backend_timers(b), b.key_groups


def _merge(views):
    out = {}
    for v in views:
        for name, table in v.items():
            dst = out.setdefault(name, {})
            assert not set(dst) & set(table), "a key appeared in two key-group ranges"
            dst.update(table)
    return out


@pytest.mark.parametrize("new_parallelism", [1, 3, 4, 32])
def test_restore_at_any_parallelism_gives_the_same_state(tmp_path, new_parallelism):
    meta, model, clock = _build(tmp_path.as_uri(), {}, 2, 1500, seed=7)
    job = statelog.open(tmp_path.as_uri())
    views, timers = [], set()
    for i in range(new_parallelism):
        view, t, kgr = _restore_view(job, meta, i, new_parallelism, clock)
        for table in view.values():
            for key, _ns in table:
                assert statelog.key_group_of(key, 32) in kgr
        views.append(view)
        timers |= t
    assert _merge(views) == model.visible(clock.now)
    assert timers == model.timers
    job.close()


def test_three_key_group_ranges_union_equals_the_subtask(tmp_path):
    """Restoring one subtask's state as three key-group ranges gives exactly the same union."""
    meta, model, clock = _build(tmp_path.as_uri(), {}, 1, 1200, seed=3)
    job = statelog.open(tmp_path.as_uri())
    whole, whole_timers, _ = _restore_view(job, meta, 0, 1, clock)
    assert whole == model.visible(clock.now)
    handles = meta.operators["op"].subtasks
    parts, part_timers = [], set()
    for kgr in (KeyGroupRange(0, 9), KeyGroupRange(10, 20), KeyGroupRange(21, 31)):
        restored = job.read_restored(meta, "op", kgr)
        assert all(not r.key_groups.intersect(kgr).is_empty for r in restored.inherited)
        assert {r.key_groups for r in restored.inherited} <= {kgr}
        # through the backend at parallelism 3 these are exactly the ranges of subtasks 0..2
        assert handles[0].key_groups == KeyGroupRange(0, 31)
    for i in range(3):
        view, t, _ = _restore_view(job, meta, i, 3, clock)
        parts.append(view)
        part_timers |= t
    assert _merge(parts) == whole
    assert part_timers == whole_timers
    job.close()


def test_rescaled_job_continues_and_checkpoints_again(tmp_path):
    """p=2 -> p=3: the restored subtasks inherit ranges, write new streams, and checkpoint."""
    meta, model, clock = _build(tmp_path.as_uri(), {}, 2, 600, seed=11)
    job = statelog.open(tmp_path.as_uri())
    drivers = [
        Driver(job.backend("op", subtask=i, parallelism=3, restore=meta, clock=clock), model, clock)
        for i in range(3)
    ]
    for n in range(300):
        key = n % 50
        d = drivers[statelog.subtask_for_key_group(32, 3, statelog.key_group_of(key, 32))]
        d.set_key(key)
        d.set_ns(None)
        d.apply(("value_rmw", 1))
    meta2 = job.checkpoint(sources={"offset": 900})
    assert meta2.operators["op"].parallelism == 3
    job.close()
    job = statelog.open(tmp_path.as_uri())
    view, timers, _ = _restore_view(job, meta2, 0, 1, clock)
    assert view == model.visible(clock.now)
    assert timers == model.timers
    job.close()


@pytest.mark.s3
def test_rescale_on_s3(s3_server):
    spec = s3_server.unique_root()
    meta, model, clock = _build(spec.url, spec.options, 2, 500, seed=5)
    job = statelog.open(spec.url, store_options=spec.options)
    views = [_restore_view(job, meta, i, 3, clock)[0] for i in range(3)]
    assert _merge(views) == model.visible(clock.now)
    job.close()
