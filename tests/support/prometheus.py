"""A real Prometheus server (Debian's ``prometheus`` package) on loopback, for the session.

The ``prometheus`` fixture (session; loaded by ``tests/conftest.py``) starts one server with
a scrape and evaluation interval of 1 s, ``honor_labels: true`` (the statelog ``job`` label
wins over the scrape job's, as docs/monitoring.md says to configure it) and targets read from
files (``file_sd_configs``, re-read every second): a test adds the metrics endpoint of a job
or daemon with :meth:`PrometheusServer.add_target` and asks the server's HTTP API.

The rule file loaded is a copy of ``docs/monitoring/alerts.yml`` whose checkpoint-age alert
has a threshold of :data:`CHECKPOINT_AGE_S` seconds and ``for: 1s`` instead of minutes, so that
a test can stall a checkpoint and see the alert fire and resolve in seconds
(:func:`templated_rules`). ``make test`` installs the package when missing (``make prometheus``,
apt-get as root); without it the Prometheus tests skip, or fail under
``STATELOG_PROMETHEUS_REQUIRED=1`` (as ``make test`` runs them).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RULES = Path(__file__).resolve().parents[2] / "docs" / "monitoring" / "alerts.yml"
CHECKPOINT_AGE_S = 3
# what the test copy of the rules replaces; each must occur exactly once in the rule file
_TEMPLATED = {
    "expr: time() - statelog_job_last_checkpoint_timestamp_seconds > 600\n        for: 2m":
        f"expr: time() - statelog_job_last_checkpoint_timestamp_seconds > {CHECKPOINT_AGE_S}\n        for: 1s",
}  # fmt: skip


def templated_rules() -> str:
    """``docs/monitoring/alerts.yml`` with the checkpoint-age alert's threshold and ``for`` short."""
    text = RULES.read_text()
    for old, new in _TEMPLATED.items():
        if text.count(old) != 1:
            raise AssertionError(f"{RULES} must hold {old!r} once for the test copy of the rules, "
                                 f"found it {text.count(old)} times: update tests/support/prometheus.py")  # fmt: skip
        text = text.replace(old, new)
    return text


class PrometheusServer:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, targets: Path, log: Path, rules: Path) -> None:
        self.proc, self.url, self.targets, self.log, self.rules = proc, url, targets, log, rules

    def add_target(self, name: str, url: str) -> None:
        """Scrape ``url`` (``http://host:port`` of a ``/metrics`` endpoint) as target ``name``."""
        host = urllib.parse.urlsplit(url).netloc
        tmp = self.targets / f".{name}.tmp"
        tmp.write_text(json.dumps([{"targets": [host], "labels": {"target": name}}]))
        tmp.rename(self.targets / f"{name}.json")  # whole files only: the server re-reads the directory

    def remove_target(self, name: str) -> None:
        (self.targets / f"{name}.json").unlink(missing_ok=True)

    def api(self, path: str, **params: str) -> Any:
        """``data`` of a GET of ``/api/v1/<path>``."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of ``promql`` now: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        return self.api("query", query=promql)["result"]

    def names(self) -> set[str]:
        """Every metric name the server holds."""
        return set(self.api("label/__name__/values"))

    def alerts(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts ``name`` with ``labels``."""
        return [a for a in self.api("alerts")["alerts"]
                if a["labels"].get("alertname") == name and all(a["labels"].get(k) == v for k, v in labels.items())]  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(work: Path) -> PrometheusServer:
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus")
    targets = work / "targets"
    targets.mkdir()
    rules = work / "alerts.yml"
    rules.write_text(templated_rules())
    config = work / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{
            "job_name": "statelog", "honor_labels": True,
            "file_sd_configs": [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}],
        }],
    }))  # fmt: skip
    port = _free_port()
    log = work / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=out, stderr=subprocess.STDOUT, cwd=work,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    server = PrometheusServer(proc, url, targets, log, rules)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode} at start: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"prometheus was not ready within 60 s: {log.read_text()[-2000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One Prometheus server for the session (module docstring)."""
    try:
        server = start_prometheus(tmp_path_factory.mktemp("prometheus"))
    except FileNotFoundError:
        if os.environ.get("STATELOG_PROMETHEUS_REQUIRED"):
            pytest.fail("prometheus is not on PATH although `make test` should have installed it "
                        "(apt-get install prometheus)", pytrace=False)  # fmt: skip
        pytest.skip("prometheus is not on PATH: `make test` installs it (apt-get install -y prometheus)")
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
