"""The Prometheus side of a consumer loop's metrics (``statelog.loop_metrics``).

Loaded by :meth:`LoopMetrics.serve <statelog.loop_metrics.LoopMetrics.serve>` (and by the
runtime's metrics, which share :func:`state_families`), so that a loop without
``metrics_port`` never imports ``prometheus_client``. Every metric and its labels:
``docs/monitoring.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from statelog.metrics import MetricsServer, ProcessMetrics


class ServedMetrics(Protocol):
    """What this module needs of a :class:`statelog.loop_metrics.LoopMetrics` (which imports
    this module when it serves: no import back)."""

    name: str

    def snapshot(self) -> dict[str, Any]: ...

    def health(self) -> tuple[bool, dict[str, Any]]: ...


PREFIX = "statelog_job_"


def serve_loop_metrics(metrics: ServedMetrics, host: str, port: int) -> tuple[CollectorRegistry, MetricsServer]:
    """A registry with ``metrics`` and this process's figures, served at ``host:port``."""
    registry = CollectorRegistry()
    registry.register(LoopCollector(metrics))  # type: ignore[arg-type]  # a collector: collect()
    registry.register(ProcessMetrics({"job": metrics.name}))
    return registry, MetricsServer(registry, metrics.health, host, port)


class LoopCollector:
    """The metric families of one :class:`LoopMetrics`, made when Prometheus scrapes."""

    def __init__(self, metrics: ServedMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        snap = m.snapshot()
        job = [m.name]
        completed, failed, last = snap["completed"], snap["failed"], snap["last"]
        rin, rout, lag = snap["records_in"], snap["records_out"], snap["lag"]
        buckets, duration_sum = snap["buckets"], snap["duration_sum"]
        h = HistogramMetricFamily(PREFIX + "checkpoint_duration_seconds", "end-to-end duration of completed "
                                  "checkpoints", labels=["job"])  # fmt: skip
        bounds = [*(floatToGoString(b) for b in snap["bucket_bounds"]), "+Inf"]
        h.add_metric(job, list(zip(bounds, itertools.accumulate(buckets), strict=True)), duration_sum)
        yield h

        def family(kind: type, name: str, doc: str, value: float) -> Metric:
            f = kind(PREFIX + name, doc, labels=["job"])
            f.add_metric(job, value)
            return f

        yield family(CounterMetricFamily, "checkpoints_completed", "checkpoints completed (published) by this job",
                     completed)  # fmt: skip
        yield family(CounterMetricFamily, "checkpoints_failed", "checkpoints that failed", failed)
        yield family(GaugeMetricFamily, "running", "1 while the job runs (here: open and holding its root)",
                     0 if snap["fenced"] else 1)  # fmt: skip
        yield family(CounterMetricFamily, "records_in", "records the job read", rin)
        yield family(CounterMetricFamily, "records_out", "records the job wrote downstream", rout)
        if last:
            yield family(GaugeMetricFamily, "last_checkpoint_id", "id of the newest completed checkpoint", last["id"])
            yield family(GaugeMetricFamily, "last_checkpoint_timestamp_seconds", "when the newest completed "
                         "checkpoint was taken (Unix time)", last["timestamp"])  # fmt: skip
            yield family(GaugeMetricFamily, "last_checkpoint_duration_seconds", "end-to-end duration of the newest "
                         "checkpoint", last["duration"])  # fmt: skip
            yield family(GaugeMetricFamily, "last_checkpoint_incremental_bytes", "changelog bytes the newest "
                         "checkpoint added", last["incremental"])  # fmt: skip
            yield family(GaugeMetricFamily, "changelog_tail_bytes", "changelog bytes the newest checkpoint "
                         "references after its materialization (what a restore replays)", last["tail"])  # fmt: skip
        if snap["watermark_ms"] is not None:
            yield family(GaugeMetricFamily, "watermark_seconds", "the job's event-time watermark (Unix time)",
                         snap["watermark_ms"] / 1000)  # fmt: skip
        g = GaugeMetricFamily(PREFIX + "kafka_lag_records", "records of a Kafka partition not read yet (its high "
                              "watermark minus the position)", labels=["job", "topic", "partition"])  # fmt: skip
        for (topic, partition), value in sorted(lag.items()):
            g.add_metric([m.name, topic, str(partition)], value)
        yield g
        yield from state_families(m.name, ((b.operator_uid, b.subtask, b.size_figures())
                                           for b in snap["backends"]))  # fmt: skip
        if snap.get("local_copies") is not None:
            yield from local_copies_families(m.name, [("loop", snap["local_copies"])])



def state_families(job: str, figures: Iterable[tuple[str, int, dict[str, int]]]) -> Iterator[Metric]:
    """The state metrics of ``(operator, subtask, KeyedStateBackend.size_figures())`` (the
    runtime's tasks report the same figures)."""
    labels = ["job", "operator", "subtask"]
    entries = GaugeMetricFamily(PREFIX + "state_entries", "entries of the keyed state in memory (memory store)",
                                labels=labels)  # fmt: skip
    disk = GaugeMetricFamily(PREFIX + "state_disk_bytes", "bytes of the disk store's database", labels=labels)
    kinds = [*labels, "kind"]
    hits = CounterMetricFamily(PREFIX + "state_cache_hits", "lookups the disk store's working set served from memory "
                               "(kind=key: a key set current that was resident)", labels=kinds)  # fmt: skip
    misses = CounterMetricFamily(PREFIX + "state_cache_misses", "reads of the disk store's database for what was not "
                                 "in the working set's memory (kind=key: keys, on demand or prefetched; kind=entry: "
                                 "entries of namespaced states)", labels=kinds)  # fmt: skip
    for operator, subtask, fig in figures:
        values = [job, operator, str(subtask)]
        if "entries" in fig:
            entries.add_metric(values, fig["entries"])
        if "disk_bytes" in fig:
            disk.add_metric(values, fig["disk_bytes"])
        if "cache_hits" in fig:
            hits.add_metric([*values, "key"], fig["cache_hits"])
        if "cache_misses" in fig:
            misses.add_metric([*values, "key"], fig["cache_misses"])
        if "cache_entry_misses" in fig:
            misses.add_metric([*values, "entry"], fig["cache_entry_misses"])
    yield entries
    yield disk
    yield hits
    yield misses


LOCAL_COPY_COUNTERS = (
    ("hits", "local_copies_hits", "reads of segments, tables and manifests served from a verified local copy"),
    ("misses", "local_copies_misses", "reads of segments, tables and manifests that went to the store (no copy)"),
    ("evictions", "local_copies_evictions", "local copies deleted to stay within the budget (least recently "
     "used first)"),
    ("dropped", "local_copies_dropped", "local copies that failed verification (size or CRC-32), deleted and "
     "read from the store"),
    ("skipped", "local_copies_skipped", "local copies not made because the disk refused them (full, read-only)"),
    ("copies_made", "local_copies_made", "local copies written"),
    ("bytes_local", "local_copies_read_bytes", "bytes read from local copies"),
    ("bytes_remote", "local_copies_remote_read_bytes", "bytes of copied object kinds read from the store"),
    ("images_made", "local_copies_images_made", "table images written (state tables kept decoded)"),
    ("image_hits", "local_copies_image_hits", "state tables restored from their table image (also counted in hits)"),
)


def local_copies_families(job: str, figures: Iterable[tuple[str, dict[str, int]]]) -> Iterator[Metric]:
    """The local copies' metrics of ``(process, LocalCopies.figures())`` (``process``: ``loop``
    for a consumer loop, ``worker-<n>`` for the runtime's workers)."""
    labels = ["job", "process"]
    rows = list(figures)
    for key, name, doc in LOCAL_COPY_COUNTERS:
        c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
        for process, fig in rows:
            c.add_metric([job, process], fig.get(key, 0))
        yield c
    size = GaugeMetricFamily(PREFIX + "local_copies_bytes", "bytes of the local copies this process accounts "
                             "for in its directory", labels=labels)  # fmt: skip
    budget = GaugeMetricFamily(PREFIX + "local_copies_budget_bytes", "the local copies' budget", labels=labels)
    for process, fig in rows:
        size.add_metric([job, process], fig.get("size_bytes", 0))
        budget.add_metric([job, process], fig.get("budget_bytes", 0))
    yield size
    yield budget
