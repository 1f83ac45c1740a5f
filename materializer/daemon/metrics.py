"""The materializer daemon's Prometheus metrics (served by :class:`statelog.metrics.MetricsServer`).

Read from the daemon when scraped (a ``prometheus_client`` collector), except the durations,
which are histograms the daemon observes; the ``process_*`` figures are the daemon process's.
Every series has the label ``owner``. Names and meanings: ``docs/monitoring.md``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from statelog.metrics import ProcessMetrics

PREFIX = "statelog_materializer_"
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class DaemonMetrics(Collector):
    """A registry with the daemon's metrics; the daemon calls :meth:`observe_cycle`."""

    def __init__(self, daemon: Any) -> None:  # a MaterializerDaemon (it imports this module)
        self.daemon = daemon
        self.registry = CollectorRegistry()
        self.materialize_seconds = Histogram(
            PREFIX + "materialization_duration_seconds", "time to build and publish one materialization",
            ["owner"], buckets=DURATION_BUCKETS, registry=self.registry,
        ).labels(daemon.owner)  # fmt: skip
        self.cycle_seconds = Histogram(
            PREFIX + "cycle_duration_seconds", "time of one daemon cycle (lease, decision, materialization, GC)",
            ["owner"], buckets=DURATION_BUCKETS, registry=self.registry,
        ).labels(daemon.owner)  # fmt: skip
        self.registry.register(self)
        self.registry.register(ProcessMetrics({"owner": daemon.owner}))
        self.failures = 0
        self.rows_written = 0
        self.bytes_written = 0
        self.gc_objects = 0
        self.gc_bytes = 0
        self.gc_checkpoints = 0
        self.last_success: float | None = None
        self.last_error: str | None = None

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

    def collect(self) -> Iterator[Metric]:
        d = self.daemon
        s = d.last_summary or {}
        labels = ["owner"]
        owner = [d.owner]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            c.add_metric(owner, value)
            return c

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            g.add_metric(owner, value)
            return g

        yield counter("cycles", "daemon cycles completed", d.cycles)
        yield counter("cycle_failures", "daemon cycles that failed (retried with backoff)", self.failures)
        yield counter("materializations", "materializations this daemon published", d.published)
        yield counter("rows_written", "rows of the materializations this daemon published", self.rows_written)
        yield counter("bytes_written", "bytes of state tables this daemon wrote", self.bytes_written)
        yield counter("gc_deleted_objects", "objects deleted by this daemon's garbage collection", self.gc_objects)
        yield counter("gc_deleted_bytes", "bytes deleted by this daemon's garbage collection", self.gc_bytes)
        yield counter("gc_deleted_checkpoints", "checkpoint metadata deleted by retention in GC", self.gc_checkpoints)
        yield gauge("lease_held", "1 while this daemon holds the root's leader lease", 1 if s.get("leader") else 0)
        yield gauge("lease_generation", "the lease generation this daemon holds (0: none)", s.get("generation") or 0)
        latest, newest = s.get("latest_checkpoint"), s.get("materialization") or s.get("latest_materialization")
        if latest is not None:
            yield gauge("latest_checkpoint", "id of the newest checkpoint of the root", latest["id"])
            if latest.get("timestamp_ms") is not None:
                yield gauge("latest_checkpoint_timestamp_seconds", "when the root's newest checkpoint was taken "
                            "(Unix time)", latest["timestamp_ms"] / 1000)  # fmt: skip
            yield gauge("tail_bytes", "changelog bytes of the newest checkpoint after its materialization",
                        latest["tail_bytes"])  # fmt: skip
        if latest is not None and newest is not None:
            yield gauge("lag_checkpoints", "checkpoints the newest materialization is behind the newest checkpoint",
                        max(0, latest["id"] - newest["checkpoint_id"]))  # fmt: skip
            yield gauge("lag_seconds", "seconds from the newest materialization's publication to the newest "
                        "checkpoint (0 when it is not behind)",
                        0.0 if latest["id"] <= newest["checkpoint_id"]
                        else max(0.0, (latest["timestamp_ms"] - newest["created_ms"]) / 1000))  # fmt: skip
        if self.last_success is not None:
            yield gauge("last_success_timestamp_seconds", "when the last cycle completed (Unix time)",
                        self.last_success)  # fmt: skip
