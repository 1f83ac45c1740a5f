"""The Prometheus side of the materializer daemon's metrics (:mod:`materializer.daemon.metrics`).

Loaded by :meth:`DaemonMetrics.serve <materializer.daemon.metrics.DaemonMetrics.serve>`, so
that a daemon without ``metrics_port`` (a background materializer by default) never imports
``prometheus_client``. Names and meanings: ``docs/monitoring.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from statelog.metrics import MetricsServer, ProcessMetrics

PREFIX = "statelog_materializer_"


def serve_daemon_metrics(
    metrics: Any, health: Callable[[], tuple[bool, dict[str, Any]]], host: str, port: int
) -> MetricsServer:
    """A registry with the daemon's metrics and its process's, served on ``host:port``."""
    registry = CollectorRegistry()
    registry.register(DaemonCollector(metrics))
    registry.register(ProcessMetrics({"owner": metrics.daemon.owner}))
    return MetricsServer(registry, health, host, port)


class DaemonCollector(Collector):
    """Reads a :class:`~materializer.daemon.metrics.DaemonMetrics` (and its daemon) when scraped
    (typed ``Any``: that module imports this one when it serves, no import back)."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics

    def _histogram(self, name: str, doc: str, histogram: Any, owner: list[str]) -> Metric:
        buckets, total = histogram.snapshot()
        bounds = [floatToGoString(b) for b in histogram.bounds] + ["+Inf"]
        h = HistogramMetricFamily(PREFIX + name, doc, labels=["owner"])
        h.add_metric(owner, list(zip(bounds, itertools.accumulate(buckets), strict=True)), total)
        return h

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        d = m.daemon
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

        yield self._histogram("materialization_duration_seconds", "time to build and publish one materialization",
                              m.materialize_seconds, owner)  # fmt: skip
        yield self._histogram("cycle_duration_seconds", "time of one daemon cycle (lease, decision, materialization, "
                              "GC)", m.cycle_seconds, owner)  # fmt: skip
        yield counter("cycles", "daemon cycles completed", d.cycles)
        yield counter("cycle_failures", "daemon cycles that failed (retried with backoff)", m.failures)
        yield counter("materializations", "materializations this daemon published", d.published)
        yield counter("rows_written", "rows of the materializations this daemon published", m.rows_written)
        yield counter("bytes_written", "bytes of state tables this daemon wrote", m.bytes_written)
        yield counter("gc_deleted_objects", "objects deleted by this daemon's garbage collection", m.gc_objects)
        yield counter("gc_deleted_bytes", "bytes deleted by this daemon's garbage collection", m.gc_bytes)
        yield counter("gc_deleted_checkpoints", "checkpoint metadata deleted by retention in GC", m.gc_checkpoints)
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
        if m.last_success is not None:
            yield gauge("last_success_timestamp_seconds", "when the last cycle completed (Unix time)",
                        m.last_success)  # fmt: skip
