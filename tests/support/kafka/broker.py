"""A real Kafka-protocol broker for tests: noida-db's Kafka service on loopback.

The binary comes from the ``noida-db`` PyPI wheel (a dev dependency, installed by
``make test``); the client is ``confluent-kafka`` (the ``kafka`` extra, also in ``dev``).
:func:`start_kafka` runs ``noida-db start --only kafka`` on ``127.0.0.1`` with a free port
and a fresh data directory, waits until a metadata request and a produce/consume round trip
work, and returns a :class:`KafkaBroker`. :meth:`KafkaBroker.stop` terminates the process
(then kills it) and removes the data directory; the broker also dies with the test process
(``atexit`` and, on Linux, the parent-death signal). :class:`KafkaBroker` is a context
manager too; :meth:`KafkaBroker.restart` stops it and starts it again on the same port with
the same data.

What this broker does and does not do is pinned by ``tests/runtime/connectors/kafka/test_broker.py``: ordered
partitions, seek, ``offsets_for_times``, transactions (aborted records hidden from
``read_committed`` readers, zombie fencing, a killed producer's open transaction aborted
when a new producer with the same ``transactional.id`` initialises). It does NOT expire an
open transaction after ``transaction.timeout.ms``; it is one broker (replication factor 1).
It applies time retention by record timestamp within a second or two: records stamped older
than the topic's ``retention.ms`` (default 7 days; e.g. ``timestamp=1000``) vanish and the
log start offset moves past them. Tests with made-up timestamps create their topic with
``config={"retention.ms": "-1"}``.

How a test uses it (the ``kafka_broker`` session fixture in ``tests/conftest.py``)::

    from confluent_kafka import Consumer, Producer

    def test_something(kafka_broker):
        topic = kafka_broker.create_topic(partitions=3)   # unique name, returned
        producer = Producer(kafka_broker.config())        # {"bootstrap.servers": ...}
        consumer = Consumer(kafka_broker.config(**{"group.id": "g"}))
        kafka_broker.bootstrap_servers                    # "127.0.0.1:<port>"

``create_topic(name=None, partitions=1, config=None)`` creates a topic (a unique ``t-<uuid>`` name when
none is given) and waits until its metadata shows every partition with a leader;
``admin()`` gives a ``confluent_kafka.admin.AdminClient``. With ``pytest -n 2`` each xdist
worker starts its own broker. Subprocesses get ``bootstrap_servers`` (a plain string).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.procs import free_ports, log_tail, set_pdeathsig, stop_process

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT = 30.0
_INSTALL_HINT = (
    "Run `make test` (which installs the dev dependencies, including noida-db and "
    "confluent-kafka) or `pip install -e '.[dev]'`"
)


class KafkaUnavailable(RuntimeError):
    """The broker binary or the client library is not installed."""


def find_noida() -> str:
    """Path of the real ``noida-db`` binary inside the ``noida_db`` package.

    Not the ``noida-db`` console script: that wrapper runs the binary as a child, so
    terminating the wrapper would leave the broker running.
    """
    try:
        import noida_db
    except ImportError as exc:
        raise KafkaUnavailable(
            f"the Kafka broker tests need the noida-db package, which is not installed in "
            f"{sys.executable}. {_INSTALL_HINT}"
        ) from exc
    binary = Path(noida_db.__file__).parent / "noida-db"
    if not binary.is_file():
        raise KafkaUnavailable(
            f"the noida-db package is installed but its binary {binary} is missing; "
            f"reinstall it (pip install --force-reinstall noida-db)"
        )
    if not os.access(binary, os.X_OK):  # wheels may drop the mode bits; the wrapper sets them too
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(binary)


def _require_client() -> None:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as exc:
        raise KafkaUnavailable(
            f"the Kafka tests need the confluent-kafka client, which is not installed in "
            f"{sys.executable}. {_INSTALL_HINT}"
        ) from exc


@dataclass
class KafkaBroker:
    """A running noida-db Kafka broker on loopback."""

    host: str
    port: int
    process: subprocess.Popen[bytes] = field(repr=False)
    base_dir: Path
    log_path: Path
    remove_dir: bool = True
    startup_seconds: float = 0.0

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def config(self, **overrides: Any) -> dict[str, Any]:
        """A confluent-kafka client configuration for this broker, plus ``overrides``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(overrides)
        return conf

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.config())

    def create_topic(
        self,
        name: str | None = None,
        partitions: int = 1,
        timeout: float = 10.0,
        config: dict[str, str] | None = None,
    ) -> str:
        """Create a topic with ``partitions`` partitions and return its name once usable.

        ``config`` is the topic configuration, e.g. ``{"retention.ms": "-1"}``.
        """
        from confluent_kafka.admin import NewTopic

        if partitions < 1:
            raise ValueError(f"a topic needs at least one partition, got partitions={partitions}")
        topic = name or f"t-{uuid.uuid4().hex[:12]}"
        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=timeout,
        )
        futures[topic].result(timeout)
        deadline = time.monotonic() + timeout
        while True:
            meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                return topic
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"topic {topic!r} was created but its metadata did not show "
                    f"{partitions} partitions with leaders within {timeout:.0f}s: {meta}"
                )
            time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def restart(self, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the broker (SIGTERM, or SIGKILL with ``kill``) and start it again on the same
        port with the same data directory; returns once it works end to end again."""
        args = list(self.process.args)
        if kill:
            self.process.kill()
            self.process.wait(timeout)
        else:
            stop_process(self.process, "noida-db", timeout)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.log_path.parent,
                start_new_session=True,
                preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
            )
        _wait_ready(self, time.monotonic() + STARTUP_TIMEOUT)

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, "noida-db", timeout)
        if self.remove_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def client_handles() -> int:
    """How many librdkafka clients (producers, consumers, admin clients) of this process are
    alive: each has one thread named ``rdk:main`` until it is closed or destroyed."""
    count = 0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            count += (task / "comm").read_text().strip() == "rdk:main"
    return count


def _wait_ready(broker: KafkaBroker, deadline: float) -> None:
    """Wait until the broker answers metadata requests and a round trip through a topic works."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    last: BaseException | None = None
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise RuntimeError(
                f"noida-db exited with code {broker.process.returncode} during startup; "
                f"log tail ({broker.log_path}):\n{broker.log_tail()}"
            )
        try:
            with socket.create_connection((broker.host, broker.port), timeout=0.5):
                pass
            topic = "_statelog_ready"
            if topic not in broker.admin().list_topics(timeout=5.0).topics:
                broker.create_topic(topic, partitions=1, timeout=5.0)
            producer = Producer(broker.config())
            try:
                producer.produce(topic, b"ok")
                if producer.flush(5.0) != 0:
                    raise RuntimeError("the readiness record was not delivered within 5s")
            finally:
                producer.purge()  # an undelivered record would hold up close()
                producer.close()  # not left to the collector: tests count this process's clients
            consumer = Consumer(broker.config(**{"group.id": "_statelog_ready"}))
            try:
                consumer.assign([TopicPartition(topic, 0, 0)])
                msg = consumer.poll(5.0)
                if msg is not None and msg.error() is None and msg.value() == b"ok":
                    return
                raise RuntimeError(f"the readiness record did not come back (got {msg})")
            finally:
                consumer.close()
        except (OSError, KafkaException, RuntimeError) as exc:
            # without its traceback: a traceback keeps this frame (and the clients in it) in a
            # cycle that only the collector would free
            last = exc.with_traceback(None)
        time.sleep(0.1)
    raise RuntimeError(
        f"the noida-db Kafka broker at {broker.bootstrap_servers} was not ready within "
        f"{STARTUP_TIMEOUT:.0f}s (last error: {type(last).__name__}: {last}); log tail "
        f"({broker.log_path}):\n{broker.log_tail()}"
    )


def start_kafka(base_dir: Path | None = None, *, attempts: int = 3) -> KafkaBroker:
    """Start a noida-db Kafka broker on 127.0.0.1 and return it once it works end to end.

    ``base_dir`` holds the data directory and the log (a fresh temporary directory, removed
    on :meth:`KafkaBroker.stop`, when not given). A start that dies early (a port taken
    between reservation and bind) is retried on a fresh port, up to ``attempts`` times.
    Raises :class:`KafkaUnavailable` when the binary or the client is not installed and
    ``RuntimeError`` when the broker does not come up.
    """
    _require_client()
    binary = find_noida()
    remove_dir = base_dir is None
    root = Path(tempfile.mkdtemp(prefix="statelog-kafka-")) if base_dir is None else base_dir
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        run_dir = root / f"run{attempt}"
        data_dir = run_dir / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        (port,) = free_ports(1)
        log_path = run_dir / "noida.log"
        args = [
            binary, "start", "--data-dir", str(data_dir), "--host", "127.0.0.1",
            "--only", "kafka", "--kafka-port", str(port),
        ]  # fmt: skip
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=run_dir,
                start_new_session=True,
                preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
            )
        broker = KafkaBroker("127.0.0.1", port, proc, root, log_path, remove_dir=False)
        atexit.register(broker.stop)
        try:
            _wait_ready(broker, time.monotonic() + STARTUP_TIMEOUT)
        except RuntimeError:
            died_early = proc.poll() is not None
            broker.stop()
            if died_early and attempt < attempts:
                logger.warning("noida-db start attempt %d failed; retrying", attempt)
                continue
            if remove_dir:
                shutil.rmtree(root, ignore_errors=True)
            raise
        broker.remove_dir = remove_dir
        broker.startup_seconds = time.monotonic() - started
        logger.info(
            "noida-db Kafka broker ready at %s in %.2fs (pid %d)",
            broker.bootstrap_servers,
            broker.startup_seconds,
            proc.pid,
        )
        return broker
    raise AssertionError("unreachable")  # pragma: no cover
