"""Jobs over Arrow record batches (runtime.api.batches) end to end: the batch job's state
equals the per-record job's on the same input, for every state kind it keeps and at every
parallelism; its output is every input row exactly once; it restores at another
parallelism; and the API refuses what it cannot run with a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import (
    CollectSink,
    GeneratorSource,
    JobResult,
    KeyedProcessFunction,
    NoRestart,
    StreamExecutionEnvironment,
    WatermarkStrategy,
    read_committed,
)
from runtime.errors import JobFailedError, JobGraphError
from tests.support import batch_jobs as bj
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec

PER_SPLIT = 1500


def _run(env: StreamExecutionEnvironment, kind: str) -> JobResult:
    result = env.execute(kind, timeout_s=120)
    assert result.final_checkpoint is not None
    return result


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_the_batch_jobs_state_and_output_equal_the_per_record_jobs(file_root: RootSpec, tmp_path: Path,
                                                                   parallelism: int) -> None:  # fmt: skip
    rows = bj.events(PER_SPLIT)
    states = {}
    for kind, build in (("batch", bj.build_batch), ("records", bj.build_records)):
        env = make_env(file_root, parallelism=parallelism, state_root=f"{file_root.url}/{kind}")
        build(env, bj.generator(PER_SPLIT), tmp_path / kind)
        result = _run(env, kind)
        states[kind] = bj.final_state(f"{file_root.url}/{kind}", result.final_checkpoint, parallelism)
        assert bj.as_counter(read_committed(tmp_path / kind)) == bj.as_counter(rows), kind
    assert states["batch"] == states["records"] == bj.expected_state(rows)


def test_a_parquet_source_delivers_batches_and_records_alike(file_root: RootSpec, tmp_path: Path) -> None:
    """ParquetSource reads Arrow batches natively (batch_rows across row groups)."""
    bj.write_parquet(tmp_path / "in", PER_SPLIT)
    rows = bj.events(PER_SPLIT)
    states = {}
    for kind, build in (("batch", bj.build_batch), ("records", bj.build_records)):
        env = make_env(file_root, parallelism=2, state_root=f"{file_root.url}/{kind}")
        if kind == "batch":
            bj.build_batch(env, bj.parquet(tmp_path / "in"), None, batch_rows=1000)
        else:
            build(env, bj.parquet(tmp_path / "in"), None)
        result = _run(env, kind)
        states[kind] = bj.final_state(f"{file_root.url}/{kind}", result.final_checkpoint, 2)
        assert bj.as_counter(result.collected["out"]) == bj.as_counter(rows), kind
    assert states["batch"] == states["records"] == bj.expected_state(rows)


def test_the_aggregates_emit_the_touched_keys_with_their_new_values(file_root: RootSpec) -> None:
    env = make_env(file_root, parallelism=2)
    bj.build_batch(env, bj.generator(300), None, batch_rows=64)
    result = _run(env, "batch")
    final: dict[tuple[str, int], int] = {}
    for row in result.collected["agg-out"]:  # per key, its last update is the final value
        (name, value), = ((n, v) for n, v in row.items() if n != "k")
        final[(name, row["k"])] = value  # updates of one key come from one subtask, in order
    expected = bj.expected_state(bj.events(300))
    for uid, how in bj.AGG_UIDS.items():
        assert {k: v for (n, k), v in final.items() if n == how} == expected[(uid, how)]


@pytest.mark.parametrize(("first", "second"), [(2, 3), (2, 1)])
def test_a_batch_job_restores_at_another_parallelism(file_root: RootSpec, tmp_path: Path, first: int,
                                                     second: int) -> None:  # fmt: skip
    """The first run reads half of every split; the second restores its checkpoint at
    another parallelism and reads the rest: state and output as if one run read it all."""
    env = make_env(file_root, parallelism=first)
    bj.build_batch(env, bj.generator(PER_SPLIT // 2), tmp_path / "out")
    _run(env, "first")
    env = make_env(file_root, parallelism=second)
    bj.build_batch(env, bj.generator(PER_SPLIT), tmp_path / "out")
    result = env.execute("second", restore="latest", timeout_s=120)
    rows = bj.events(PER_SPLIT)
    assert bj.final_state(file_root.url, result.final_checkpoint, second) == bj.expected_state(rows)
    assert bj.as_counter(read_committed(tmp_path / "out")) == bj.as_counter(rows)


def test_unaligned_checkpoints_carry_batches(file_root: RootSpec, tmp_path: Path) -> None:
    """In unaligned mode barriers overtake batches (in-flight data of the checkpoints)."""
    env = make_env(file_root, parallelism=2, mode="exactly_once_unaligned", checkpoint_interval_s=0.05)
    bj.build_batch(env, bj.generator(PER_SPLIT, rate=6000), tmp_path / "out", batch_rows=50)
    result = _run(env, "unaligned")
    rows = bj.events(PER_SPLIT)
    assert bj.final_state(file_root.url, result.final_checkpoint, 2) == bj.expected_state(rows)
    assert bj.as_counter(read_committed(tmp_path / "out")) == bj.as_counter(rows)


# -- what the API refuses ------------------------------------------------------------------------


def test_batches_refuse_watermarks_and_bad_sizes(file_root: RootSpec) -> None:
    env = make_env(file_root)
    src = bj.generator(10)
    with pytest.raises(JobGraphError, match="carry no event timestamps"):
        env.from_source(src, uid="e", batches=True, watermarks=WatermarkStrategy(bj.key_of))
    with pytest.raises(JobGraphError, match=r"batch_rows must be an int in \[1, "):
        env.from_source(src, uid="e", batches=True, batch_rows=0)
    with pytest.raises(JobGraphError, match="batches must be True or False"):
        env.from_source(src, uid="e", batches="yes")


def test_batch_operators_need_a_column_key_and_known_aggregations(file_root: RootSpec) -> None:
    env = make_env(file_root)
    stream = env.from_source(bj.generator(10), uid="e", batches=True)
    with pytest.raises(JobGraphError, match=r"needs a stream keyed by one column: key_by\('column name'\)"):
        stream.key_by(bj.key_of).process_batches(bj.BatchKinds(), uid="p")
    with pytest.raises(JobGraphError, match="how must be one of"):
        stream.key_by("k").aggregate("median", uid="a", column="v")
    with pytest.raises(JobGraphError, match=r"aggregate\('sum'\) needs the column"):
        stream.key_by("k").aggregate("sum", uid="a")
    with pytest.raises(JobGraphError, match="a callable key selector or a column name"):
        stream.key_by("")


class _PerRecord(KeyedProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        yield value


def test_a_batch_reaching_a_per_record_operator_fails_the_job_saying_what_to_use(file_root: RootSpec) -> None:
    env = make_env(file_root, parallelism=1, restart_strategy=NoRestart())
    (env.from_source(bj.generator(10), uid="e", batches=True).key_by("k")
        .process(_PerRecord(), uid="p").sink_to(CollectSink(), uid="out"))  # fmt: skip
    with pytest.raises(JobFailedError, match=r"use process_batches\(\.\.\.\) or aggregate"):
        env.execute("wrong", timeout_s=60)


def test_records_keyed_by_a_column_name_go_per_record(file_root: RootSpec) -> None:
    """key_by("k") on a stream of dict records keys by record["k"]: the per-record job."""
    env = make_env(file_root, parallelism=2)
    keyed = env.from_source(bj.generator(200), uid="events").key_by("k")
    keyed.process(bj.RecordKinds(), uid="kinds").sink_to(CollectSink(), uid="out")
    result = _run(env, "records")
    state = bj.final_state(file_root.url, result.final_checkpoint, 2)
    expected = bj.expected_state(bj.events(200))
    assert {k: v for k, v in state.items() if k[0] == "kinds"} == {k: v for k, v in expected.items() if k[0] == "kinds"}


def test_records_of_other_sources_become_batches_of_their_fields(file_root: RootSpec) -> None:
    env = make_env(file_root, parallelism=1)
    src = GeneratorSource(lambda s, i: i, 100)
    env.from_source(src, uid="e", batches=True, batch_rows=7).sink_to(CollectSink(), uid="out")
    result = _run(env, "values")
    assert sorted(r["value"] for r in result.collected["out"]) == list(range(100))
