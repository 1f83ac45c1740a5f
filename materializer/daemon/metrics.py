"""The materializer daemon's metrics: plain counters the daemon updates, served through
Prometheus by :mod:`materializer.daemon.metrics_export` when ``metrics_port`` is set.

Until served nothing imports ``prometheus_client`` (a background materializer starts without
it). When served they are read from the daemon when scraped, except the durations, which are
histograms the daemon observes; the ``process_*`` figures are the daemon process's. Every
series has the label ``owner``. Names and meanings: ``docs/monitoring.md``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from typing import Any

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class DurationHistogram:
    """Counts per bucket of :data:`DURATION_BUCKETS` (``+Inf`` last) and their sum; thread-safe."""

    bounds = DURATION_BUCKETS

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
            self.sum += seconds

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self.buckets), self.sum


class DaemonMetrics:
    """The daemon's counters and durations; the daemon calls :meth:`observe_cycle`."""

    def __init__(self, daemon: Any) -> None:  # a MaterializerDaemon (it imports this module)
        self.daemon = daemon
        self.materialize_seconds = DurationHistogram()
        self.cycle_seconds = DurationHistogram()
        self.failures = 0
        self.rows_written = 0
        self.bytes_written = 0
        self.gc_objects = 0
        self.gc_bytes = 0
        self.gc_checkpoints = 0
        self.last_success: float | None = None
        self.last_error: str | None = None

    def serve(self, health: Callable[[], tuple[bool, dict[str, Any]]], host: str, port: int) -> Any:
        """Serve these metrics (``/metrics``) and ``health`` (``/healthz``) on ``host:port``;
        returns the :class:`statelog.metrics.MetricsServer`."""
        from materializer.daemon.metrics_export import serve_daemon_metrics

        return serve_daemon_metrics(self, health, host, port)

    def observe_cycle(self, summary: dict[str, Any]) -> None:
        self.cycle_seconds.observe(summary.get("duration_s") or 0.0)
        self.last_success = time.time()
        self.last_error = None
        m = summary.get("materialization")
        if m:
            stats = m.get("stats") or {}
            self.materialize_seconds.observe(float(stats.get("duration_ms", 0.0)) / 1000)
            self.rows_written += int(m.get("rows") or 0)
            self.bytes_written += int(stats.get("bytes_written", m.get("bytes") or 0))
        gc = summary.get("gc")
        if isinstance(gc, dict) and "error" not in gc:
            self.gc_objects += int(gc.get("objects_deleted") or 0)
            self.gc_bytes += int(gc.get("bytes_deleted") or 0)
            self.gc_checkpoints += len(gc.get("checkpoints_deleted") or ())

    def observe_failure(self, error: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {error}"
