"""The metrics of a consumer loop on ``statelog.open`` (``statelog/loop_metrics.py``), read from
its endpoint: checkpoints completed and failed, the loop's own figures, the state's size,
the labels of every series, ``/healthz`` of a fenced job, a taken or bad port.
(A real Prometheus scrapes the same endpoint: ``tests/e2e/test_prometheus.py``.)"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import statelog
from statelog import ValueStateDescriptor
from statelog.errors import CheckpointAbortedError, ConfigError

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_a_consumer_loop_serves_its_metrics(tmp_path: Path) -> None:
    root = (tmp_path / "clicks").as_uri()
    with statelog.open(root, metrics_port=0) as job:
        assert job.metrics.url is not None and job.metrics.url.startswith("http://127.0.0.1:")
        b = job.backend("counter")
        state = b.get_state(COUNT)
        for k in range(25):
            b.set_current_key(k)
            state.update(k)
        job.metrics.records_in(25)
        job.metrics.records_out(3)
        job.metrics.watermark(1_800_000_000_500)
        job.metrics.kafka_lag("clicks", 2, 40)
        meta = job.checkpoint()
        m = scrape(job.metrics.url)
        job_label = (("job", "clicks"),)  # the root's last path segment
        assert m[("statelog_job_checkpoints_completed_total", job_label)] == 1
        assert m[("statelog_job_checkpoints_failed_total", job_label)] == 0
        assert m[("statelog_job_last_checkpoint_id", job_label)] == meta.checkpoint_id
        assert m[("statelog_job_last_checkpoint_timestamp_seconds", job_label)] == meta.timestamp_ms / 1000
        assert m[("statelog_job_changelog_tail_bytes", job_label)] == meta.changelog_bytes
        assert m[("statelog_job_checkpoint_duration_seconds_count", job_label)] == 1
        assert m[("statelog_job_records_in_total", job_label)] == 25
        assert m[("statelog_job_records_out_total", job_label)] == 3
        assert m[("statelog_job_watermark_seconds", job_label)] == 1_800_000_000.5
        assert m[("statelog_job_kafka_lag_records", (("job", "clicks"), ("partition", "2"), ("topic", "clicks")))] == 40
        assert m[("statelog_job_state_entries", (("job", "clicks"), ("operator", "counter"), ("subtask", "0")))] == 25
        proc = (("job", "clicks"), ("process", "main"))
        assert m[("process_resident_memory_bytes", proc)] > 0 and m[("process_threads", proc)] >= 2
        assert m[("process_open_fds", proc)] > 0 and ("process_cpu_seconds_total", proc) in m
        assert all(("job", "clicks") in labels for _name, labels in m)  # every series has the job label
        with urllib.request.urlopen(job.metrics.url + "/healthz", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read())["completed_checkpoints"] == 1
        url = job.metrics.url
    with pytest.raises(urllib.error.URLError):  # closed with the job
        urllib.request.urlopen(url + "/metrics", timeout=5)


def test_failed_checkpoints_are_counted(tmp_path: Path) -> None:
    with statelog.open((tmp_path / "root").as_uri(), metrics_port=0, metrics_job="loop") as job:
        b = job.backend("counter")
        b.set_current_key("k")
        b.get_state(COUNT).update(1)
        with pytest.raises(CheckpointAbortedError):  # no time for the changelog to be durable
            job.checkpoint(timeout=-1)
        assert job.metrics.url is not None
        m = scrape(job.metrics.url)
        assert m[("statelog_job_checkpoints_failed_total", (("job", "loop"),))] == 1
        assert m[("statelog_job_checkpoints_completed_total", (("job", "loop"),))] == 0


def test_a_taken_or_bad_metrics_port_is_a_clear_error(tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            statelog.open(root, metrics_port=port)
    with pytest.raises(ConfigError, match="metrics_port must be a TCP port"):
        statelog.open(root, metrics_port=70000)
    with pytest.raises(ConfigError, match="metrics_job"):
        statelog.open(root, metrics_job="")
    with statelog.open(root) as job:  # the root is free again; no server without metrics_port
        assert job.metrics.url is None


def test_the_disk_working_set_counts_its_hits_and_misses(tmp_path: Path) -> None:
    """Working-set hit rate: keys set current that were resident are hits, keys read from the
    database misses (on demand or by a prefetch, whose keys' first records are not hits too)."""
    root = (tmp_path / "clicks").as_uri()
    with statelog.open(root, metrics_port=0, state_store="disk", state_dir=str(tmp_path / "ws")) as job:
        b = job.backend("counter")
        state = b.get_state(COUNT)
        for k in [*range(10), *range(10), *range(10)]:  # 10 misses, then 20 hits
            b.set_current_key(k)
            state.update(state.value() + 1)
        assert job.metrics.url is not None
        m = scrape(job.metrics.url)
        labels = (("job", "clicks"), ("kind", "key"), ("operator", "counter"), ("subtask", "0"))
        assert (m[("statelog_job_state_cache_hits_total", labels)], m[("statelog_job_state_cache_misses_total", labels)]) == (20, 10)
        b.prefetch(list(range(10, 20)))  # 10 misses read in one batch ...
        assert b.size_figures()["cache_hits"] == 20
        for k in [*range(10, 20), *range(10, 15)]:  # ... whose first records are no hits; 5 hits after
            b.set_current_key(k)
            state.update(state.value() + 1)
        m = scrape(job.metrics.url)
        assert (m[("statelog_job_state_cache_hits_total", labels)], m[("statelog_job_state_cache_misses_total", labels)]) == (25, 20)
        entry = (("job", "clicks"), ("kind", "entry"), ("operator", "counter"), ("subtask", "0"))
        assert m[("statelog_job_state_cache_misses_total", entry)] == 0  # no namespaced state here
