"""Property test of the batch calls with materializations: any interleaving of single and
batch calls on every state kind, with checkpoints, materializations, savepoints, restarts
and GC runs (``tests/support/materialized_scenario.py``), equals the model. The same with
crashes and restores of every mode: ``tests/e2e/test_property.py``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from statelog.restore.ondemand.options import OnDemandOptions
from tests.support import materialized_scenario
from tests.support.materialized_scenario import CONTROL_OPS, flatten
from tests.support.state_ops import BATCH_OPS, STATE_OPS

# bursts of single and batch calls, each followed by a checkpoint, materialization, savepoint,
# restart or GC run (the scenario of tests/e2e/test_property_materialized.py)
BATCH_STEPS = st.lists(st.tuples(st.lists(st.one_of(STATE_OPS, BATCH_OPS), max_size=20), CONTROL_OPS),
                       min_size=4, max_size=8)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=BATCH_STEPS)
# a batch of list appends whose later keys wrote an earlier key's list back on the disk-backed
# working set (its cache of 6 entries) before the list was extended
@example(steps=[([("key", 1), ("list_add", "a"), ("key", 2.0**80),
                  ("batch_list_add", [(1, 25), ("b", 33), ("user-9", 77), (b"\x00k", 82), (2.0**80, 55), (2, 60), (0, 9),
                                      (9, 73)], False)], ("checkpoint",))])
@pytest.mark.parametrize("mode", ["eager", "touched", "disk"])
def test_single_and_batch_calls_materialized_restore_equals_model(tmp_path_factory, monkeypatch, steps, mode):
    if mode == "touched":
        monkeypatch.setattr(materialized_scenario, "ON_DEMAND", OnDemandOptions(segment_read_cost_bytes=0))
    root = tmp_path_factory.mktemp("propmb").as_uri()
    materialized_scenario.run_scenario(root, {}, flatten(steps), mode)
