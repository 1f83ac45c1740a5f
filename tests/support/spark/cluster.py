"""A real Spark standalone cluster on loopback for tests: one master and ``workers`` workers (default 1).

Both run from the pip ``pyspark`` package (``bin/spark-class`` with the Master and Worker
classes; the package has no ``sbin/start-*.sh``). The worker starts with an environment
**without** any ``AWS_*`` variable, so its executors see only what the driver ships to
them, unlike ``local-cluster[...]``, whose executors inherit the driver's environment.

:func:`start_cluster` waits (with a timeout) until the worker registered with the master;
:meth:`SparkCluster.stop` terminates both process groups (then kills them).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.support.s3server import S3Server

REPO = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT = 90.0
SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def clean_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without ``AWS_*`` variables."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("AWS_")}
    env["SPARK_HOME"] = str(SPARK_HOME)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def driver_env(s3: S3Server, **extra: str) -> dict[str, str]:
    """The environment of a driver process of the cluster tests: the S3 endpoint and
    credentials in ``AWS_*`` only, this repository on the path, ``extra`` added."""
    env = clean_env()
    env.update({
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_REGION": s3.region,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        **extra,
    })  # fmt: skip
    return env


def _session_java_options() -> str:
    """The driver's JVM options of the test session's ``spark-defaults.conf`` (``SPARK_CONF_DIR``,
    set by ``tests/conftest.py``), empty without one."""
    conf = Path(os.environ.get("SPARK_CONF_DIR", "/nonexistent")) / "spark-defaults.conf"
    for line in conf.read_text().splitlines() if conf.is_file() else []:
        key, _, value = line.partition(" ")
        if key == "spark.driver.extraJavaOptions":
            return value.strip()
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SparkCluster:
    master_url: str
    work_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def logs(self) -> list[Path]:
        """Every log the cluster wrote: master, worker and each executor's stdout/stderr."""
        return sorted(p for p in self.work_dir.rglob("*") if p.is_file() and (p.suffix == ".log" or p.name in (
            "stdout", "stderr")))

    def log_mark(self) -> dict[Path, int]:
        """The size of every log now: :meth:`log_text` ``since`` it reads only what came after
        (a cluster shared by several tests)."""
        return {p: p.stat().st_size for p in self.logs}

    def log_text(self, since: dict[Path, int] | None = None) -> str:
        marks = since or {}
        parts = []
        for p in self.logs:
            with p.open("rb") as f:
                f.seek(marks.get(p, 0))
                parts.append(f.read().decode(errors="replace"))
        return "\n".join(parts)

    def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM to each process group, SIGKILL to those still running after ``timeout``
        (a worker waits for its executors to exit; nothing of a test cluster needs keeping)."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)


def _launch(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", str(SPARK_CLASS), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # its own process group: stop() signals the JVM and its children
        )


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes], deadline: float) -> re.Match[str]:
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        m = rx.search(text)
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: the process exited ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{log.name}: no {pattern!r} within the timeout:\n{log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def start_cluster(work_dir: Path, cores: int = 2, memory: str = "1g",
                  timeout: float = STARTUP_TIMEOUT, workers: int = 1) -> Iterator[SparkCluster]:
    """``workers`` worker processes with ``cores`` cores and ``memory`` each."""
    work_dir.mkdir(parents=True, exist_ok=True)
    env = clean_env()
    env["SPARK_DAEMON_MEMORY"] = "256m"
    env["SPARK_DAEMON_JAVA_OPTS"] = _session_java_options()  # the master's and workers' JVMs
    env["SPARK_LOG_DIR"] = str(work_dir)
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    port = _free_port()
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", work_dir)
    deadline = time.monotonic() + timeout
    try:
        master_log = work_dir / "master.log"
        master = _launch(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                          "--webui-port", "0"], master_log, env)
        cluster.processes.append(master)
        _wait_for(master_log, r"I have been elected leader|New state: ALIVE", master, deadline)
        started = []
        for k in range(workers):  # all at once: each JVM takes seconds to start
            worker_log = work_dir / ("worker.log" if k == 0 else f"worker-{k}.log")
            worker = _launch(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                              "--webui-port", "0", "--cores", str(cores), "--memory", memory,
                              "--work-dir", str(work_dir / f"work-{k}" if k else work_dir / "work"),
                              cluster.master_url], worker_log, env)  # fmt: skip
            cluster.processes.append(worker)
            started.append((worker_log, worker))
        for worker_log, worker in started:
            _wait_for(worker_log, r"Successfully registered with master", worker, deadline)
        yield cluster
    finally:
        cluster.stop()
