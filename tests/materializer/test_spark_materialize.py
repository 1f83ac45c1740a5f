"""Materialization as a Spark job (``materializer.spark``) equals the in-process materialization.

Both engines materialize the same checkpoints; their manifests must list the same states,
covered positions and files (key-group ranges, row counts; reused files by the same path) and
every pair of files must hold the same rows. The property variant runs the materializer's
property test (``tests/e2e/test_property_materialized.py``, its scenario in ``tests/support/materialized_scenario.py``) with every completed
materialization repeated on Spark and compared; the Spark manifest, published last, is the
one later checkpoints build on, so the restores the scenario checks read Spark's tables.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import statelog
from materializer.build import MaterializeOptions, materialize
from materializer.daemon.loop import MaterializerDaemon
from materializer.spark import SparkEngine
from statelog.materialization.manifest import list_manifests, load_manifest
from tests.support.materialized_scenario import STEPS, Scenario, flatten
from tests.support.s3server import S3Server
from tests.support.spark import jobs
from tests.support.spark.jobs import assert_same_tables
from tests.support.wait import FakeClock
from tools.cli import main as cli_main


@pytest.fixture(scope="module")
def small_job(tmp_path_factory: pytest.TempPathFactory) -> jobs.Built:
    root = (tmp_path_factory.mktemp("spark-mat") / "root").as_uri()
    return jobs.build(root, {}, seed=11, ops=200)


@pytest.mark.parametrize(("units", "tasks"), [(16, 64), (16, None), (4, 3), (1, 64)])
def test_spark_materialization_equals_in_process(spark: Any, small_job: jobs.Built, units: int,
                                                 tasks: int | None) -> None:
    b = small_job
    job = statelog.open(b.root, create=False)
    engine = SparkEngine(b.root, spark=spark, tasks=tasks)
    try:
        options = MaterializeOptions(units=units)
        compared = 0
        for cid in (b.c1, b.c3, b.c4):  # changelog only; a base plus a tail; a longer tail with deletes
            meta = job.load_checkpoint(cid)
            ours = materialize(job.store, meta, options=options)
            theirs = materialize(job.store, meta, options=options, engine=engine)
            assert theirs.stats["changelog_records"] == ours.stats["changelog_records"]
            assert theirs.stats["files_reused"] == ours.stats["files_reused"]
            compared += assert_same_tables(job.store, ours, theirs)
        assert compared > 0
        # three handles (operator op at parallelism 2, words at 1); local[2] has 2 cores
        if tasks == 64 and units > 1:
            assert engine.last_tasks > 3  # handles cut into units
        else:  # 2 cores or 3 tasks: one task per handle; one unit: a handle is never cut
            assert engine.last_tasks == 3
    finally:
        job.close()


def test_base_files_spanning_units_are_reused_alike(spark: Any, tmp_path: Path) -> None:
    """A base written with coarser units (4 key groups a file) under finer ones (1): the
    units a base file spans stay in one task, so an untouched file is reused as in process."""
    import pyarrow as pa

    from statelog import ListStateDescriptor, ValueStateDescriptor

    root = (tmp_path / "root").as_uri()
    job = statelog.open(root, max_parallelism=16)
    job.materialization_poll_s = 0
    try:
        b = job.backend("op")
        count = b.get_state(ValueStateDescriptor("count", pa.int64(), default=0))
        seen = b.get_state(ListStateDescriptor("seen", pa.string()))
        for k in range(300):
            b.set_current_key(k)
            count.update(k)
            seen.add(str(k))
        materialize(job.store, job.checkpoint(), options=MaterializeOptions(units=4))
        for k in range(3):  # only "count" changes, in a few key groups
            b.set_current_key(k)
            count.update(-k)
        meta = job.checkpoint()
        assert all(h.materialization for h in meta.operators["op"].subtasks)  # built on the coarse base
        fine = MaterializeOptions(units=16)
        engine = SparkEngine(root, spark=spark, tasks=64)
        ours = materialize(job.store, meta, options=fine)
        theirs = materialize(job.store, meta, options=fine, engine=engine)
        assert assert_same_tables(job.store, ours, theirs) > 0
        assert engine.last_tasks == 4  # 16 units, kept together in fours by the base files
        assert theirs.stats["files_reused"] == ours.stats["files_reused"] >= 4  # the untouched "seen" files
    finally:
        job.close()


def test_group_units_keeps_consecutive_units_together() -> None:
    from materializer.spark import group_units
    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.table_writer import UnitWork

    def piece(lo: int, hi: int) -> UnitWork:
        return UnitWork("op", 0, None, KeyGroupRange(lo, hi), (), ())  # type: ignore[arg-type]

    pieces = [piece(0, 3), piece(4, 7), piece(8, 15), piece(16, 19)]
    assert [p.key_groups for p in group_units(pieces, 2)] == [KeyGroupRange(0, 7), KeyGroupRange(8, 19)]
    assert [p.key_groups for p in group_units(pieces, 1)] == [KeyGroupRange(0, 19)]
    assert group_units(pieces, 4) == pieces and group_units(pieces, 9) == pieces


@pytest.mark.s3
def test_spark_materialization_on_s3_equals_in_process(spark: Any, s3_server: S3Server) -> None:
    root = f"s3://{s3_server.bucket}/spark-mat-{uuid.uuid4().hex}"
    b = jobs.build(root, s3_server.options(), seed=5, ops=120)
    job = statelog.open(root, store_options=s3_server.options(), create=False)
    try:
        meta = job.load_checkpoint(b.c4)
        ours = materialize(job.store, meta)
        theirs = materialize(job.store, meta, engine=SparkEngine(root, s3_server.options(), spark=spark))
        assert assert_same_tables(job.store, ours, theirs) > 0
        assert theirs.stats["files_reused"] > 0  # built on m1: untouched units are reused, on Spark too
    finally:
        job.close()


class SparkScenario(Scenario):
    """The property scenario with every completed materialization repeated on Spark."""

    spark: Any = None
    compared = 0

    def materialize(self, pick: int, units: int, kill: tuple | None) -> None:
        before = {k for k, *_ in list_manifests(self.job.store)}
        super().materialize(pick, units, kill)
        new = {k for k, *_ in list_manifests(self.job.store)} - before
        if kill is not None or not new:
            return
        ours = load_manifest(self.job.store, new.pop())
        meta = self.job.load_checkpoint(ours.checkpoint_id)
        engine = SparkEngine(self.root, self.options, spark=self.spark, tasks=64)  # the finest cut
        theirs = materialize(self.job.store, meta, options=MaterializeOptions(units=units), engine=engine)
        assert_same_tables(self.job.store, ours, theirs)
        SparkScenario.compared += 1


# the suite runs 10 examples; STATELOG_LONG_LOOPS=1 runs 20
PROPERTY_EXAMPLES = 20 if os.environ.get("STATELOG_LONG_LOOPS") == "1" else 10


@pytest.mark.slow
@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_property_spark_materialization_equals_in_process(spark: Any, tmp_path_factory: Any, steps: Any) -> None:
    root = tmp_path_factory.mktemp("propspark").as_uri()
    SparkScenario.spark = spark
    SparkScenario(root, {}, "eager").run(flatten(steps))


def test_property_variant_compared_something(spark: Any) -> None:
    """Runs after the property test (file order; the ``spark`` fixture puts both in the same
    xdist group, so on the same worker): it must have compared materializations."""
    if SparkScenario.spark is None:
        pytest.skip("the property test did not run (deselected)")
    print(f"\nSpark materializations compared with in-process ones: {SparkScenario.compared}")  # shown with -s
    assert SparkScenario.compared > 0


def test_daemon_with_engine_spark_publishes_under_its_lease(spark: Any, tmp_path: Path) -> None:
    b = jobs.build((tmp_path / "root").as_uri(), {}, seed=2, ops=80)
    job = statelog.open(b.root, create=False)
    try:
        daemon = MaterializerDaemon(job.store, table_engine=SparkEngine(b.root, spark=spark), run_gc=False)
        summary = daemon.run_once(force=True)
        assert summary["action"] == "materialized", summary
        m = load_manifest(job.store, summary["materialization"]["manifest"])
        assert m.checkpoint_id == b.c4 and m.lease_generation == summary["generation"] >= 1
        assert_same_tables(job.store, materialize(job.store, job.load_checkpoint(b.c4)), m)
    finally:
        job.close()


def test_daemon_option_engine_spark_uses_the_active_session(spark: Any, tmp_path: Path) -> None:
    b = jobs.build((tmp_path / "root").as_uri(), {}, seed=6, ops=60)
    job = statelog.open(b.root, create=False)
    try:
        daemon = MaterializerDaemon(job.store, engine="spark", run_gc=False, max_tail_bytes=1)
        assert isinstance(daemon.engine, SparkEngine)
        summary = daemon.run(once=True)
        assert summary is not None and summary["action"] == "materialized", summary
        assert daemon.engine.last_tasks >= 1  # the tables were written by Spark tasks
        assert spark.sparkContext._jsc is not None  # the session it did not start is not stopped
        assert spark.range(3).count() == 3
    finally:
        job.close()


def test_daemon_fenced_during_the_spark_job_publishes_nothing(spark: Any, tmp_path: Path) -> None:
    """Another daemon takes the lease over while the Spark tasks run: the fencing check refuses
    to publish (as in tests/materializer/test_daemon.py::test_stale_leader_cannot_publish)."""
    b = jobs.build((tmp_path / "root").as_uri(), {}, seed=4, ops=80)
    ttl = 30.0
    job = statelog.open(b.root, create=False)
    other_store = statelog.open(b.root, create=False)
    try:
        clock_b = FakeClock()
        other = MaterializerDaemon(other_store.store, owner="b", run_gc=False, lease_ttl_s=ttl, clock=clock_b)
        fired: list[str] = []

        def mid_job(what: str, done: int, total: int) -> None:
            if "Spark tasks" in what and not fired:
                fired.append(what)
                assert not other.lease.try_acquire()  # B starts observing A's lease ...
                clock_b.advance(ttl + 1)  # ... which A does not renew for a ttl (A's clock stands still)
                assert other.lease.try_acquire()

        a = MaterializerDaemon(job.store, owner="a", run_gc=False, lease_ttl_s=ttl, clock=FakeClock(),
                               progress=mid_job, table_engine=SparkEngine(b.root, spark=spark))
        before = {k for k, *_ in list_manifests(job.store)}
        summary = a.run_once(force=True)
        assert fired
        assert (summary["action"], summary["leader"], summary["materialization"]) == ("fenced", False, None)
        assert {k for k, *_ in list_manifests(job.store)} == before
    finally:
        other_store.close()
        job.close()


def test_cli_materializer_run_engine_spark(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = jobs.build((tmp_path / "root").as_uri(), {}, seed=3, ops=80)
    assert cli_main(["materializer", "run", b.root, "--once", "--engine", "spark", "--no-gc", "--max-tail-bytes", "1",
                     "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["action"] == "materialized" and summary["materialization"]["checkpoint_id"] == b.c4
    job = statelog.open(b.root, create=False)
    try:
        theirs = load_manifest(job.store, summary["materialization"]["manifest"])
        assert_same_tables(job.store, materialize(job.store, job.load_checkpoint(b.c4)), theirs)
    finally:
        job.close()


@pytest.mark.parametrize(("flags", "message"), [
    (["--engine", "bogus"], "--engine must be one of in-process, spark"),
    (["--engine", "spark", "--spark-master", "nowhere"], "--spark-master: Spark does not know the master"),
])
def test_cli_bad_engine_options_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     flags: list[str], message: str) -> None:
    b = jobs.build((tmp_path / "root").as_uri(), {}, seed=3, ops=20)
    assert cli_main(["materializer", "run", b.root, "--once", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
