"""The job master's Prometheus metrics (served by :class:`statelog.metrics.MetricsServer`).

Read from the :class:`~runtime.cluster.master.JobMaster` when scraped (a ``prometheus_client``
collector): checkpoint counts and the newest checkpoint's figures from the metadata it
published, restarts, and per task (``task="<vertex>.<subtask>"``, ``vertex`` its chain of
operators) the counters each task reports with its checkpoint acknowledgements: records in
(sources: records read), records out (sent downstream), seconds back-pressured, the task's
watermark and its keyed state's size figures. Checkpoint durations and alignment times are
histograms the master observes when a checkpoint completes. The ``process_*`` figures are the
master's and its local workers' (``process="master"``, ``"worker-<n>"``). Names shared with a
consumer loop's metrics (``statelog/loop_metrics.py``) mean the same. Names and meanings:
``docs/monitoring.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from statelog.loop_metrics_export import local_copies_families, state_families
from statelog.metrics import ProcessMetrics

PREFIX = "statelog_job_"
MS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class JobMetrics(Collector):
    """A registry with the job master's metrics; the master calls :meth:`observe_checkpoint`
    and :meth:`observe_task`."""

    def __init__(self, master: Any) -> None:  # a JobMaster (it imports this module)
        self.master = master
        self.registry = CollectorRegistry()
        self.duration = Histogram(PREFIX + "checkpoint_duration_seconds",
                                  "end-to-end duration of completed checkpoints", ["job"], buckets=MS_BUCKETS,
                                  registry=self.registry)  # fmt: skip
        self.alignment = Histogram(PREFIX + "checkpoint_alignment_seconds",
                                   "the longest barrier alignment of each completed checkpoint", ["job"],
                                   buckets=MS_BUCKETS, registry=self.registry)  # fmt: skip
        self.registry.register(self)
        self.registry.register(ProcessMetrics({"job": master.name}, self._processes))
        self.last: dict[str, Any] = {}  # the newest completed checkpoint: id, stats, changelog bytes
        self.tasks: dict[str, dict[str, float]] = {}  # task key -> its newest reported counters
        self.state: dict[str, list[Any]] = {}  # task key -> its backends' (operator, subtask, size figures)
        self.copies: dict[int, dict[str, int]] = {}  # worker index -> its local copies' figures
        # channel "<edge>.<upstream subtask>-<downstream subtask>" -> what its two ends reported last
        self.channels: dict[str, dict[str, float]] = {}

    def observe_checkpoint(self, checkpoint_id: int, stats: dict[str, Any], changelog_bytes: int,
                           timestamp_ms: int | None = None) -> None:  # fmt: skip
        self.duration.labels(self.master.name).observe(float(stats.get("duration_ms", 0.0)) / 1000)
        self.alignment.labels(self.master.name).observe(float(stats.get("alignment_ms", 0.0)) / 1000)
        self.last = {"id": checkpoint_id, "stats": dict(stats), "changelog_bytes": changelog_bytes,
                     "timestamp_ms": timestamp_ms}  # fmt: skip

    def observe_task(self, task: str, stats: dict[str, Any]) -> None:
        self.tasks[task] = {k: float(stats[k]) for k in _TASK_KEYS if k in stats}
        if "state" in stats:
            self.state[task] = list(stats["state"])
        if "local_copies" in stats and "worker" in stats:
            self.copies[int(stats["worker"])] = dict(stats["local_copies"])
        for label, values in (stats.get("channels") or {}).items():
            self.channels.setdefault(label, {}).update(values)

    def _processes(self) -> dict[str, int | str]:
        """The master (this process) and the workers it started here (``/proc``)."""
        out: dict[str, int | str] = {"master": "self"}
        for i, w in enumerate(list(getattr(self.master, "workers", ()))):
            if getattr(w, "pid", None) is not None:
                out[f"worker-{i}"] = w.pid
        return out

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: healthy while an attempt runs; restarting or not started is not."""
        m = self.master
        details = {"job": m.name, "attempt": m.attempt, "completed_checkpoints": len(m.completed),
                   "restarts": max(0, m.attempt - 1)}  # fmt: skip
        if m.running_attempt and m.running_attempt == m.attempt:
            return True, details
        reason = f"restarting after: {m.failures[-1]}" if m.failures else "not running yet"
        return False, {**details, "reason": reason}

    def collect(self) -> Iterator[Metric]:
        m = self.master
        job = [m.name]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["job"])
            c.add_metric(job, value)
            return c

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["job"])
            g.add_metric(job, value)
            return g

        coordinator = getattr(m, "coordinator", None)
        failed = m.failed_checkpoints + (coordinator.failed_total if coordinator is not None else 0)
        yield counter("checkpoints_completed", "checkpoints completed (published) by this job", len(m.completed))
        yield counter("checkpoints_failed", "checkpoints that failed, were declined or timed out", failed)
        yield counter("restarts", "restarts of the job after a failure", max(0, m.attempt - 1))
        yield gauge("running", "1 while an attempt of the job runs", 1 if m.running_attempt and
                    m.running_attempt == m.attempt else 0)  # fmt: skip
        last = self.last
        if last:
            s = last["stats"]
            yield gauge("last_checkpoint_id", "id of the newest completed checkpoint", last["id"])
            yield gauge("last_checkpoint_duration_seconds", "end-to-end duration of the newest checkpoint",
                        float(s.get("duration_ms", 0.0)) / 1000)  # fmt: skip
            yield gauge("last_checkpoint_alignment_seconds", "the longest barrier alignment of the newest checkpoint",
                        float(s.get("alignment_ms", 0.0)) / 1000)  # fmt: skip
            yield gauge("last_checkpoint_incremental_bytes", "changelog bytes the newest checkpoint added",
                        float(s.get("incremental_bytes", 0)))  # fmt: skip
            yield gauge("last_checkpoint_inflight_bytes", "in-flight data persisted by the newest checkpoint",
                        float(s.get("inflight_bytes", 0)))  # fmt: skip
            yield gauge("changelog_tail_bytes", "changelog bytes the newest checkpoint references after its "
                        "materialization (what a restore replays)", float(last["changelog_bytes"]))  # fmt: skip
            if last.get("timestamp_ms") is not None:
                yield gauge("last_checkpoint_timestamp_seconds", "when the newest completed checkpoint was taken "
                            "(Unix time)", last["timestamp_ms"] / 1000)  # fmt: skip
        yield from self._task_metrics()
        yield from state_families(m.name, (fig for _task, figs in sorted(self.state.items()) for fig in figs))
        if self.copies:
            yield from local_copies_families(m.name, ((f"worker-{w}", fig) for w, fig in sorted(self.copies.items())))
        yield from self._channel_metrics()

    def _task_metrics(self) -> Iterator[Metric]:
        """Per task (``task``, ``vertex``), and the job's records read and watermark from them."""
        m = self.master
        names = getattr(m, "vertex_names", {})
        families = {key: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            PREFIX + name, doc, labels=["job", "task", "vertex"]) for key, name, doc, kind in _TASK_METRICS}  # fmt: skip
        read = 0.0
        watermarks = []
        for task, values in sorted(self.tasks.items()):
            vertex = names.get(task.split(".", 1)[0], "")
            for key, _name, _doc, _kind in _TASK_METRICS:
                if key in values:
                    v = values[key] / 1000 if key == "watermark_ms" else values[key]
                    families[key].add_metric([m.name, task, vertex], v)
            if task in getattr(m, "source_task_keys", ()):
                read += values.get("records_in", 0.0)
            if "watermark_ms" in values:
                watermarks.append(values["watermark_ms"])
        yield from families.values()
        rin = CounterMetricFamily(PREFIX + "records_in", "records the job's sources read, as of their newest "
                                  "checkpoint acknowledgements", labels=["job"])  # fmt: skip
        rin.add_metric([m.name], read)
        yield rin
        if watermarks:
            wm = GaugeMetricFamily(PREFIX + "watermark_seconds", "the job's event-time watermark: the lowest of "
                                   "its tasks' (Unix time)", labels=["job"])  # fmt: skip
            wm.add_metric([m.name], min(watermarks) / 1000)
            yield wm

    def _channel_metrics(self) -> Iterator[Metric]:
        """Per channel, as of the newest acknowledgements of its two tasks (sender and receiver)."""
        job = self.master.name
        families = []
        for key, name, doc, kind in _CHANNEL_METRICS:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                PREFIX + name, doc, labels=["job", "channel"])  # fmt: skip
            for label, values in sorted(self.channels.items()):
                if key in values:
                    family.add_metric([job, label], float(values[key]))
            families.append(family)
        return iter(families)


# (reported key, metric name, help, type) of the per-channel metrics
_CHANNEL_METRICS = (
    ("buffered_records", "channel_buffered_records", "records in the channel (sender queue, connection, receiver "
     "queue), as its sender counts them", "gauge"),
    ("buffered_frames", "channel_buffered_frames", "frames in the channel, as its sender counts them", "gauge"),
    ("queued_bytes", "channel_buffered_bytes", "pickled bytes waiting in the receiver's queue (remote channels)",
     "gauge"),
    ("bound_records", "channel_bound_records", "records the channel may hold (buffer debloating; 0: no record "
     "bound)", "gauge"),
    ("bound_frames", "channel_bound_frames", "frames the channel may hold", "gauge"),
    ("bound_bytes", "channel_bound_bytes", "bytes the bound corresponds to (remote channels with debloating)",
     "gauge"),
    ("backpressured_s", "channel_backpressured_seconds", "seconds the sender found the channel full", "counter"),
)  # fmt: skip

# (reported key, metric name, help, type) of the per-task metrics
_TASK_METRICS = (
    ("records_in", "task_records_in", "records a task took in (sources: records read), as of its newest checkpoint "
     "acknowledgement", "counter"),
    ("records_out", "task_records_out", "records a task sent downstream (sinks: 0), as of its newest "
     "acknowledgement", "counter"),
    ("backpressured_s", "task_backpressured_seconds", "seconds a task waited for room in its output channels, as "
     "of its newest acknowledgement", "counter"),
    ("watermark_ms", "task_watermark_seconds", "a task's event-time watermark (Unix time), as of its newest "
     "acknowledgement", "gauge"),
)  # fmt: skip
_TASK_KEYS = tuple(t[0] for t in _TASK_METRICS)
