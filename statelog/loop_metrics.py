"""The metrics of a consumer loop on :func:`statelog.open` (``job.metrics``).

``statelog.open(root, metrics_port=0)`` serves them (``statelog/metrics.py``'s
:class:`~statelog.metrics.MetricsServer`: ``/metrics`` and ``/healthz``) while the job is open;
``job.metrics.url`` is where. Without ``metrics_port`` nothing is served and the calls below
still count (they cost a few attribute updates). The job feeds the checkpoint figures itself
(every :meth:`StateJob.checkpoint <statelog.job.StateJob.checkpoint>`); the loop tells what only
it knows::

    job.metrics.records_in(len(batch))                 # records read
    job.metrics.records_out(n)                         # records written downstream
    job.metrics.watermark(event_time_ms)               # the loop's event-time progress
    job.metrics.kafka_lag("clicks", 0, lag)            # KafkaOffsets.checkpoint reports it

What the loop reports also goes into the checkpoint history entry of each checkpoint
(:meth:`LoopMetrics.history_fields`, ``docs/format.md`` section 12), so ``statelog ui`` shows it.
The names are the runtime's where they mean the same (``statelog_job_*``, label ``job``);
every metric and its labels: ``docs/monitoring.md``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

# checkpoint durations, seconds (the runtime's buckets)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def job_label(root: str) -> str:
    """The default ``job`` label of a root: its last path segment (``file:///var/lib/clicks``: ``clicks``)."""
    return root.rstrip("/").rsplit("/", 1)[-1] or root


class LoopMetrics:
    """The metrics of one opened job (``job.metrics``); thread-safe. Plain counters until
    served: ``prometheus_client`` objects are made by :meth:`serve` and when collected."""

    def __init__(self, name: str, backends: Callable[[], Iterable[Any]], fenced: Callable[[], Any]) -> None:
        self.name = name
        self._backends = backends
        self._fenced = fenced
        self._lock = threading.Lock()
        self.registry: Any = None  # a prometheus_client CollectorRegistry once served
        self.server: Any = None  # its statelog.metrics.MetricsServer
        # checkpoint durations: counts per bucket of DURATION_BUCKETS (+Inf last), their sum
        self._buckets = [0] * (len(DURATION_BUCKETS) + 1)
        self._duration_sum = 0.0
        self.completed = 0
        self.failed = 0
        self.records_in_total = 0
        self.records_out_total = 0
        self.watermark_ms: int | None = None
        self.lag: dict[tuple[str, int], int] = {}
        self.last: dict[str, float] = {}
        self._told: set[str] = set()  # which of records_in / records_out the loop reports
        self._previous_entry: tuple[int, float] | None = None  # (records in, monotonic s) at the last entry
        self.local_copies: Any = None  # the job's statelog.store.local_copies.LocalCopies, if any

    # -- what the loop tells -------------------------------------------------------------------

    def records_in(self, n: int = 1) -> None:
        """``n`` more records read (``statelog_job_records_in_total``)."""
        with self._lock:
            self.records_in_total += int(n)
            self._told.add("in")

    def records_out(self, n: int = 1) -> None:
        """``n`` more records written downstream (``statelog_job_records_out_total``)."""
        with self._lock:
            self.records_out_total += int(n)
            self._told.add("out")

    def watermark(self, ms: int) -> None:
        """The loop's event-time watermark, in ms since the epoch (``statelog_job_watermark_seconds``)."""
        self.watermark_ms = int(ms)

    def kafka_lag(self, topic: str, partition: int, lag: int) -> None:
        """Records of ``topic[partition]`` not read yet: its high watermark minus the loop's
        position (``statelog_job_kafka_lag_records``)."""
        with self._lock:
            self.lag[(str(topic), int(partition))] = max(0, int(lag))

    def history_fields(self) -> dict[str, Any]:
        """The loop's figures for the history entry of the checkpoint being published
        (``docs/format.md`` section 12), only those the loop reports: ``source_records`` (records
        read by this process), ``records_per_s`` (since the previous entry), ``records_out``,
        ``watermark_ms`` and ``kafka_lag`` (the sum over the partitions)."""
        out: dict[str, Any] = {}
        with self._lock:
            now = time.monotonic()
            if "in" in self._told:
                out["source_records"] = self.records_in_total
                if self._previous_entry is not None and now > self._previous_entry[1]:
                    records, then = self._previous_entry
                    out["records_per_s"] = round((self.records_in_total - records) / (now - then), 1)
                self._previous_entry = (self.records_in_total, now)
            if "out" in self._told:
                out["records_out"] = self.records_out_total
            if self.lag:
                out["kafka_lag"] = sum(self.lag.values())
        if self.watermark_ms is not None:
            out["watermark_ms"] = self.watermark_ms
        return out

    # -- what the job tells --------------------------------------------------------------------

    def timed_checkpoint(self, take: Callable[..., Any], *args: Any) -> Any:
        """``take(*args)`` (a checkpoint: its metadata), counted as completed with its duration or as failed."""
        t0 = time.monotonic()
        try:
            meta = take(*args)
        except BaseException:
            self.checkpoint_failed()
            raise
        self.checkpoint_completed(meta, time.monotonic() - t0)
        return meta

    def checkpoint_completed(self, meta: Any, duration_s: float) -> None:
        with self._lock:
            self._buckets[bisect.bisect_left(DURATION_BUCKETS, duration_s)] += 1
            self._duration_sum += duration_s
            self.completed += 1
            self.last = {
                "id": meta.checkpoint_id, "timestamp": meta.timestamp_ms / 1000, "duration": duration_s,
                "incremental": float(meta.stats.get("incremental_bytes", 0)), "tail": float(meta.changelog_bytes),
            }  # fmt: skip

    def checkpoint_failed(self) -> None:
        with self._lock:
            self.failed += 1

    # -- serving -------------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        """``http://host:port`` of ``/metrics`` and ``/healthz``; ``None`` when not served."""
        return self.server.url if self.server is not None else None

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` and ``/healthz`` (prometheus_client loads here, not at start-up)."""
        from statelog.loop_metrics_export import serve_loop_metrics

        self.registry, self.server = serve_loop_metrics(self, host, port)

    def snapshot(self) -> dict[str, Any]:
        """The counters at one instant, for the exporter."""
        with self._lock:
            return {"completed": self.completed, "failed": self.failed, "last": dict(self.last),
                    "records_in": self.records_in_total, "records_out": self.records_out_total,
                    "lag": dict(self.lag), "buckets": list(self._buckets), "duration_sum": self._duration_sum,
                    "watermark_ms": self.watermark_ms, "fenced": self._fenced() is not None,
                    "bucket_bounds": DURATION_BUCKETS,
                    "local_copies": self.local_copies.figures() if self.local_copies is not None else None,
                    "backends": list(self._backends())}  # fmt: skip

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: healthy while this process holds the root."""
        details = {"job": self.name, "completed_checkpoints": self.completed}
        fenced = self._fenced()
        if fenced is not None:
            return False, {**details, "reason": f"lost the root: {fenced}"}
        return True, details
