"""Fixtures of the Spark tests: one SparkSession for the whole test session, built jobs.

* ``spark`` (session): a ``local[2]`` SparkSession with the statelog data sources registered,
  web UI off, 2 shuffle partitions; stopped at the end of the session.
* ``built_file`` / ``built_s3`` (session): the job of :mod:`tests.support.spark.jobs` (every state kind,
  four checkpoints) on ``file://`` and on the SeaweedFS S3 server; ``built`` is parametrized
  over both. Tests must not write to these roots (restore tests use their own).
* ``standalone_cluster`` (session): a standalone master and two workers of 2 cores each on
  loopback (``tests/support/spark/cluster.py``), for the tests marked ``xdist_group("cluster")``: one
  cluster serves them all, one application at a time; a test reads the logs written since
  its start (:meth:`~tests.support.spark.cluster.SparkCluster.log_mark`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3server import RootSpec, S3Server
from tests.support.spark import jobs


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import statelog.spark

    session = statelog.spark.session(
        "local[2]",
        app_name="statelog-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        },
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.support.spark import cluster  # imports pyspark: only when a test needs the cluster

    with cluster.start_cluster(tmp_path_factory.mktemp("cluster"), cores=2, memory="1g", workers=2) as c:
        yield c


@pytest.fixture(scope="session")
def built_file(tmp_path_factory: pytest.TempPathFactory) -> jobs.Built:
    root = (tmp_path_factory.mktemp("spark-file") / "root").as_uri()
    return jobs.build(root, {})


@pytest.fixture(scope="session")
def built_s3(s3_server: S3Server) -> jobs.Built:
    return jobs.build(f"s3://{s3_server.bucket}/spark-{uuid.uuid4().hex}", s3_server.options())


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def built(request: pytest.FixtureRequest) -> jobs.Built:
    return request.getfixturevalue(f"built_{request.param}")


@pytest.fixture
def small_root(tmp_path: Path) -> RootSpec:
    return RootSpec((tmp_path / "root").as_uri(), {})
