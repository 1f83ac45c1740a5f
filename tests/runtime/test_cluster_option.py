"""``execute(cluster=...)``: bad values get a clear error before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import CollectSink, GeneratorSource, JobGraphError, StreamExecutionEnvironment
from tests.support import jobs


def _env(tmp_path: Path) -> StreamExecutionEnvironment:
    env = StreamExecutionEnvironment(parallelism=1, state_root=(tmp_path / "root").as_uri())
    env.from_source(GeneratorSource(jobs.make_click, 10, splits=1), uid="clicks").sink_to(CollectSink(), uid="out")
    return env


def test_an_unknown_cluster_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JobGraphError, match=r"cluster must be 'local' or 'spark', got 'yarn'"):
        _env(tmp_path).execute("j", cluster="yarn")


def test_a_spark_session_without_cluster_spark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JobGraphError, match=r"spark= is only used with cluster='spark'"):
        _env(tmp_path).execute("j", spark=object())


def test_cluster_spark_needs_a_spark_session(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    with pytest.raises(JobGraphError, match="must be a SparkSession or a SparkContext, got object"):
        _env(tmp_path).execute("j", cluster="spark", spark=object())
