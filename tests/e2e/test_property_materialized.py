"""Property test of materialization, GC and savepoints.

Extends ``tests/e2e/test_property.py``: random operations over every state kind, timers
and TTL (the same operation strategies, driven by the same harness) with random
checkpoints, plus

* random materializations of a retained checkpoint, some of them killed part-way: a
  :class:`~statelog.testing.FaultInjectingStore` fails the k-th ``put`` and every one
  after it (a dead process writes nothing more), so the materialization raises before its
  manifest is published -- or, with the failure *after* the put, right after it;
* random savepoints of a retained checkpoint;
* random restarts from a retained checkpoint or a savepoint (in-memory state and unflushed
  buffers dropped), after which the job goes on from the model of what it restored;
* random GC runs (``collect_garbage`` with ``grace_s=0`` and a random retention), each right
  after a checkpoint, when nothing unreferenced is still needed by the live job.

After every GC: every retained checkpoint and every savepoint restores (at a random
parallelism) to the model at that checkpoint, ``statelog verify`` exits 0, and nothing is
left below ``changelog/`` and ``materializations/`` that no retained checkpoint, savepoint
or the newest materialization references.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from materializer.build import MaterializeOptions
from statelog.restore.ondemand.options import OnDemandOptions
from tests.support import materialized_scenario
from tests.support.materialized_scenario import STEPS, STEPS_S3, Stats, flatten, run_scenario
from tests.support.state_ops import MODES

TOTALS: dict[str, Stats] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_totals() -> Any:
    yield
    for store, t in sorted(TOTALS.items()):  # shown with -s
        print(f"\nproperty totals on {store}: {t.materializations} materializations ({t.killed} killed, "
              f"{t.killed_after_publish} of them after the manifest), {len(t.adopted)} adopted, "
              f"{t.savepoints} savepoints, {t.restarts} restarts, {t.gcs} GC runs deleting {t.deleted} "
              f"objects, {t.restores_checked} restores compared")


def _tally(store: str, stats: Stats) -> None:
    t = TOTALS.setdefault(store, Stats())
    for f in ("materializations", "killed", "killed_after_publish", "savepoints", "gcs",
              "restores_checked", "restarts", "deleted"):
        setattr(t, f, getattr(t, f) + getattr(stats, f))
    t.adopted |= stats.adopted


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
@pytest.mark.parametrize("mode", [*MODES, "on-demand-sliced", "disk-touched-sliced"])
def test_materialized_restore_equals_model_file(tmp_path_factory, monkeypatch, steps, mode):
    """``-sliced``: 2 key groups and state tables of one row per row group, so that an
    on-demand restore loads key groups by slices (a key, or a key's namespaces cut apart);
    and segments of version 2, a block per key group of every stream with two records or
    more in a segment (format.md 4.2); touches read table files in ranges (footer, row groups)."""
    on_demand: dict[str, int] = {}
    kw: dict[str, Any] = {}
    if mode.endswith("touched") or mode.endswith("touched-sliced"):  # touches read their tail alone
        on_demand["segment_read_cost_bytes"] = 0
    if mode.endswith("-sliced"):
        mode = mode.removesuffix("-sliced")
        monkeypatch.setattr(materialized_scenario, "MAXP", 2)
        kw["layout"] = MaterializeOptions(row_group_rows=1, min_row_group_rows=1)
        kw["writer_options"] = {"split_min_rows": 2, "split_block_rows": 1}
        on_demand["ranged_min_bytes"] = 0
    monkeypatch.setattr(materialized_scenario, "ON_DEMAND", OnDemandOptions(**on_demand))
    root = tmp_path_factory.mktemp("propm").as_uri()
    _tally("file", run_scenario(root, {}, flatten(steps), mode, **kw))


@pytest.mark.slow
@pytest.mark.s3
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS_S3)
@pytest.mark.parametrize("mode", ["eager", "on-demand", "disk"])
def test_materialized_restore_equals_model_s3(s3_server, steps, mode):
    spec = s3_server.unique_root()
    _tally("s3", run_scenario(spec.url, dict(spec.options), flatten(steps), mode))


@pytest.mark.slow
def test_fixed_scenario_exercises_every_path(tmp_path):
    """A fixed sequence that certainly kills materializations, adopts them, GCs and restores."""
    ops: list[tuple] = []
    for r in range(6):
        for k in (0, 1, "a", "b", (1, "x"), 7):
            ops += [("key", k), ("ns", None), ("value_rmw", r), ("list_add", f"v{r}"), ("map_put", "p", r),
                    ("ttl_put", r), ("obj", {"x": [r]}), ("timer_add", "event", 100 + r), ("avg", r)]
        ops += [("tick", 7), ("checkpoint",)]
        if r == 1:
            ops += [("materialize", 0, 4, ("put", 3, False))]  # killed part-way
        elif r == 2:
            ops += [("materialize", 0, 16, None), ("savepoint", 0)]
        elif r == 3:
            ops += [("gc", 2, 3), ("restart", 0, True), ("materialize", 0, 1, ("manifest", False)),
                    ("materialize", 0, 1, None)]
        elif r == 4:
            ops += [("restart", 1, False), ("fire", 102), ("materialize", 0, 16, ("manifest", True))]
    stats = run_scenario((tmp_path / "root").as_uri(), {}, ops)
    assert stats.killed == 3 and stats.killed_after_publish == 1 and stats.savepoints == 1 and stats.gcs == 2 and stats.deleted > 0
    assert stats.adopted, "no checkpoint built on a materialization"
    assert stats.restores_checked >= 4
