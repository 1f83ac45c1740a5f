"""Prometheus metrics and a health probe over HTTP, for the long-running processes.

:class:`MetricsServer` serves one ``prometheus_client`` registry as the Prometheus text
format at ``/metrics`` (rendered by ``prometheus_client.generate_latest``) and a health
probe at ``/healthz``: ``200`` with a small JSON object when healthy, ``503`` with the reason
when not. The materializer daemon (``materializer/daemon/metrics.py``) and the runtime's job master
(``runtime/cluster/metrics.py``) each own a registry and a server on an opt-in port
(``metrics_port``; ``0`` picks a free one). The server listens on ``127.0.0.1`` unless told
otherwise, and serves nothing else; labels and health texts never carry credentials.

:class:`ProcessMetrics` adds a process's figures (``prometheus_client``'s ``ProcessCollector``:
RSS, CPU seconds, open file descriptors, start time; plus its thread count) with the
registry's own labels (``job`` or ``owner``), so that every series of a statelog endpoint
carries them. The metrics a consumer loop on :func:`statelog.open` serves are in
``statelog/loop_metrics.py``. Every metric, with its labels: ``docs/monitoring.md``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from statelog.errors import ConfigError

log = logging.getLogger(__name__)

# () -> (healthy, details): details become the JSON body of /healthz
Health = Callable[[], tuple[bool, dict[str, Any]]]


class ProcessMetrics(Collector):
    """The ``process_*`` figures of processes (``/proc``; Linux), each sample with ``labels``
    plus ``process`` (the name ``processes()`` gives it): ``process_resident_memory_bytes``,
    ``process_virtual_memory_bytes``, ``process_cpu_seconds_total``, ``process_open_fds``,
    ``process_max_fds``, ``process_start_time_seconds`` and ``process_threads``. A process
    that is gone yields nothing."""

    def __init__(self, labels: dict[str, str], processes: Callable[[], dict[str, int | str]] | None = None) -> None:
        self.labels = dict(labels)
        self.processes = processes or (lambda: {"main": "self"})

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        threads = GaugeMetricFamily("process_threads", "threads of the process", labels=[*self.labels, "process"])
        for name, pid in sorted(self.processes().items()):
            extra = {**self.labels, "process": name}
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                out = families.get(family.name)
                if out is None:
                    out = families[family.name] = Metric(family.name, family.documentation, family.type)
                for s in family.samples:
                    out.add_sample(s.name, {**s.labels, **extra}, s.value)
            n = _threads(pid)
            if n is not None:
                threads.add_metric(list(extra.values()), n)
        yield from families.values()
        yield threads


def _threads(pid: int | str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class MetricsServer:
    """``/metrics`` and ``/healthz`` of one registry, on a thread of its own."""

    def __init__(self, registry: CollectorRegistry, health: Health, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = registry
        self.health = health

        class Handler(BaseHTTPRequestHandler):
            server_version = "statelog-metrics"

            def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                elif path == "/healthz":
                    try:
                        ok, details = health()
                    except Exception as e:  # noqa: BLE001 - a failing probe is an unhealthy answer
                        ok, details = False, {"reason": f"{type(e).__name__}: {e}"}
                    body = json.dumps({"status": "ok" if ok else "unhealthy", **details}, default=str).encode()
                    self._send(200 if ok else 503, "application/json", body)
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found: /metrics and /healthz\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                log.debug("metrics: %s %s", self.address_string(), format % args)

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {e.strerror or e}; pick another metrics_port "
                "(0: any free port) or metrics_host"
            ) from None
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="statelog-metrics", daemon=True)
        self._thread.start()
        log.info("metrics at http://%s:%d/metrics, health at /healthz", self.host, self.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
