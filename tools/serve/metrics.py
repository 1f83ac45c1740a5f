"""Prometheus metrics of ``statelog serve`` (served by :class:`statelog.metrics.MetricsServer`).

One :class:`ServeMetrics` per server, with a registry of its own (no global registry). The
replica gauges are read from the follower's position when scraped; requests are recorded by
the serving code with :meth:`ServeMetrics.observe`::

    metrics.observe("lookup", "ok", seconds)

``kind`` is one of :data:`KINDS` (``lookup``, ``batch``, ``scan``, ``sql``, ``other``) and
``outcome`` one of :data:`OUTCOMES` (``ok``, ``client_error``, ``refused``, ``server_error``);
any server (the HTTP one, a Flight server) calls it once per request. Names and meanings:
``docs/monitoring.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from statelog.following.follower import Follower

PREFIX = "statelog_serve_"
KINDS = ("lookup", "batch", "scan", "sql", "other")
OUTCOMES = ("ok", "client_error", "refused", "server_error")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class ServeMetrics(Collector):
    """The registry of one server: request counters and latencies, and the follower's position."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower
        self.registry = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "requests answered, by kind and outcome",
                                ["kind", "outcome"], registry=self.registry)  # fmt: skip
        self.latency = Histogram(PREFIX + "request_duration_seconds", "time to answer a request, by kind",
                                 ["kind"], buckets=LATENCY_BUCKETS, registry=self.registry)  # fmt: skip
        for kind in KINDS:
            self.latency.labels(kind)
            for outcome in OUTCOMES:
                self.requests.labels(kind, outcome)
        self.registry.register(self)

    def observe(self, kind: str, outcome: str, seconds: float) -> None:
        """Count one request of ``kind`` (:data:`KINDS`) with ``outcome`` (:data:`OUTCOMES`) that took ``seconds``."""
        if kind not in KINDS:
            kind = "other"
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: expected one of {OUTCOMES}, got {outcome!r}")
        self.requests.labels(kind, outcome).inc()
        self.latency.labels(kind).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        p = self.follower.position

        def gauge(name: str, doc: str, value: Any) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, value=float("nan") if value is None else float(value))

        yield gauge("replica_lag_seconds", "seconds the replica is behind the writer's newest checkpoint", p.lag_s)
        yield gauge("replica_lag_checkpoints", "completed checkpoints the replica has not applied yet", p.lag_checkpoints)
        yield gauge("checkpoint_id", "the checkpoint id the replica serves (-1: none yet)",
                    -1 if p.checkpoint_id is None else p.checkpoint_id)  # fmt: skip
        c = CounterMetricFamily(PREFIX + "follower_restores", "full restores the follower made (the first included)")
        c.add_metric([], float(p.restores))
        yield c

    def health(self) -> tuple[bool, dict[str, Any]]:
        p = self.follower.position
        return p.checkpoint_id is not None, {"checkpoint_id": p.checkpoint_id, "lag_s": p.lag_s}
