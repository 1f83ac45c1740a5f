"""Property test of the batch calls: any interleaving of single and batch calls on every
state kind, with checkpoints, crashes and restores (eager, on demand, disk working set),
equals the model (the scenario of ``tests/e2e/test_property.py``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.test_property import OPS, reads_alone, run_scenario
from tests.support.state_ops import BATCH_OPS, MODES

BATCH_MIX = st.one_of(OPS, BATCH_OPS, BATCH_OPS)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(BATCH_MIX, min_size=5, max_size=100), coalesce=st.booleans())
@pytest.mark.parametrize("mode", MODES)
def test_single_and_batch_calls_restore_equals_model(tmp_path_factory, monkeypatch, ops, coalesce, mode):
    reads_alone(monkeypatch, mode)
    root = tmp_path_factory.mktemp("prop").as_uri()
    run_scenario(root, {}, ops, coalesce, mode)
