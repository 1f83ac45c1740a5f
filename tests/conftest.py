"""Shared fixtures: job roots on the local filesystem and on a real S3 server (SeaweedFS).

* ``s3_server`` (session): the running :class:`tests.support.s3server.S3Server`.
* ``s3_root`` / ``file_root`` (function): a fresh, empty :class:`tests.support.s3server.RootSpec`.
* ``store_root`` (function, parametrized ``file`` / ``s3``): the same test on both stores.
* ``kafka_broker`` (session): a :class:`tests.support.kafka.broker.KafkaBroker` (noida-db on loopback):
  ``.bootstrap_servers``, ``.config(**overrides)``, ``.create_topic(name=None, partitions=1)``.
* ``prometheus`` (session, ``tests/support/prometheus.py``): a Prometheus server on loopback that
  scrapes the targets a test adds.

Every Spark JVM of the session (the in-process session, the CLI's, the clusters' drivers and
executors) reads ``tests/support/spark/conf/spark-defaults.conf``: ``SPARK_CONF_DIR`` is set here.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from statelog.store.local_copies import DIRECTORY_ENV
from tests.support.kafka.broker import KafkaBroker, start_kafka
from tests.support.s3server import RootSpec, S3Server, start_seaweedfs

logger = logging.getLogger(__name__)

# the Spark fixtures, for the Spark tests of every package; the session's Prometheus server;
# the CLI table-width fixtures
pytest_plugins = ["tests.support.spark.fixtures", "tests.support.prometheus", "tests.support.table_widths"]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS S3 server on loopback with bucket ``statelog-test``, for the session."""
    try:
        server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    logger.info("SeaweedFS startup took %.2fs", server.startup_seconds)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A Kafka-protocol broker (noida-db) on loopback for the session; see tests/support/kafka/broker.py."""
    try:
        broker = start_kafka(tmp_path_factory.mktemp("kafka"))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    logger.info("Kafka broker startup took %.2fs", broker.startup_seconds)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def s3_root(s3_server: S3Server) -> RootSpec:
    """A unique, empty ``s3://statelog-test/<uuid>`` root with options for ``open_store``."""
    return RootSpec(f"s3://{s3_server.bucket}/{uuid.uuid4().hex}", s3_server.options())


@pytest.fixture
def file_root(tmp_path: Path) -> RootSpec:
    """A fresh ``file://`` root below ``tmp_path`` (the directory does not exist yet)."""
    return RootSpec((tmp_path / "root").as_uri(), {})


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store_root(request: pytest.FixtureRequest) -> RootSpec:
    """A fresh job root on each store: the local filesystem, then SeaweedFS."""
    name = "file_root" if request.param == "file" else "s3_root"
    return request.getfixturevalue(name)


# the xdist groups that take longest, longest first (minutes each on a 2-core machine)
LONG_GROUPS = ("spark", "cluster", "clickstream", "prometheus")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests of the one SparkSession (fixture ``spark``) run on one worker under ``--dist
    loadgroup``; Spark tests with their own JVMs (subprocesses, clusters) may run on either.

    On an xdist worker the long work comes first: the groups of ``LONG_GROUPS``, then the
    tests marked ``slow``, then the rest, each in collection order. xdist hands the work out
    in this order, so the short tests at the end keep both workers busy until the last one
    (a long test started last left one worker idle for a minute)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
    if hasattr(config, "workerinput"):  # every worker sorts alike: they must collect the same list
        items.sort(key=_long_first)


def _long_first(item: pytest.Item) -> int:
    mark = item.get_closest_marker("xdist_group")
    name = (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark is not None else None
    if name in LONG_GROUPS:
        return LONG_GROUPS.index(name)
    return len(LONG_GROUPS) + (0 if item.get_closest_marker("slow") else 1)


SPARK_CONF_DIR = Path(__file__).parent / "support" / "spark" / "conf"


def pytest_configure(config: pytest.Config) -> None:
    os.environ["SPARK_CONF_DIR"] = str(SPARK_CONF_DIR)  # before any JVM starts; inherited
    # the runtime and the consumer loop keep local copies by default: in a directory of this
    # session, not the user's cache (inherited by the workers)
    os.environ[DIRECTORY_ENV] = config._statelog_copies = tempfile.mkdtemp(prefix="statelog-test-copies-")  # type: ignore[attr-defined]
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        config.pluginmanager.register(_GroupCheck(), "statelog-group-check")


def pytest_unconfigure(config: pytest.Config) -> None:
    copies = getattr(config, "_statelog_copies", None)
    if copies is not None:
        shutil.rmtree(copies, ignore_errors=True)


class _GroupCheck:
    """Under ``--dist loadgroup`` a grouped test's id ends in ``@group``. The groups were lost
    silently twice (the hook above ran after xdist's; pytest 9.2 renamed what xdist 3.8
    sets), and each worker then started its own SparkSession: such tests now fail."""

    def __init__(self) -> None:
        self.lost: set[str] = set()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.lost = {i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid}

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid in self.lost:
            pytest.fail("xdist_group is ignored by this pytest/pytest-xdist pair: install the versions "
                        "pyproject.toml pins", pytrace=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around the terminal reporter's own summary
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    """The ids of failed tests once more, last: on CI pytest prints whole assertion diffs in
    the short summary, and a log cut to its end must still say which test failed."""
    yield
    failed = [r.nodeid for key in ("failed", "error") for r in terminalreporter.stats.get(key, [])]
    if failed:
        terminalreporter.write_sep("=", "failed tests")
        for nodeid in failed:
            terminalreporter.write_line(f"FAILED {nodeid}")
