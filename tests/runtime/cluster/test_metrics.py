"""The job master's /metrics and /healthz, scraped while a job runs, against its checkpoints.

A windowed clicks job (tests/support/jobs.py, paced input) runs with ``metrics_port=0``;
scrapes during the run must agree with the checkpoint metadata the job published: the
completed count and the newest id, its duration, alignment and incremental bytes, the
changelog tail it references; per-task record counters grow between scrapes. After a
worker is killed the restart is counted. A taken port fails the job's start clearly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import statelog
from runtime import FixedDelay
from statelog.errors import ConfigError
from tests.support import jobs
from tests.support.jobs import make_env
from tests.support.metrics import scrape
from tests.support.s3server import RootSpec
from tests.support.wait import wait_until


def value(m: dict, name: str) -> float:
    return m[(name, ())]


def health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_job_metrics_agree_with_the_published_checkpoints(file_root: RootSpec, tmp_path: Path) -> None:
    env = make_env(file_root, metrics_port=0, checkpoint_interval_s=0.3, retain_checkpoints=1000,
                   restart_strategy=FixedDelay(attempts=3, delay_s=0.0))  # fmt: skip
    jobs.build_clicks(env, tmp_path / "windows", 12_000, rate=2000)
    client = env.execute_async("metrics")
    assert client.wait_running(1, timeout=60)
    server = client.master.metrics_server
    assert server is not None
    url = server.url
    code, body = health(url)
    assert code == 200 and body["status"] == "ok" and body["attempt"] == 1
    scrapes = []
    killed = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(scrapes) < 8:
        time.sleep(0.5)
        m = scrape(url)
        if ("statelog_job_last_checkpoint_id", ()) in m:
            scrapes.append(m)
        if len(scrapes) == 4 and not killed:
            os.kill(client.worker_pids()[1], signal.SIGKILL)  # one restart, counted
            killed = True
            assert client.wait_running(2, timeout=60)
    result = client.wait(120)
    assert len(scrapes) >= 6, "the job ended before the scrapes"
    completed = [value(s, "statelog_job_checkpoints_completed_total") for s in scrapes]
    assert completed == sorted(completed) and completed[-1] > completed[0] > 0
    with statelog.open(file_root.url, create=False) as job:
        ids = job.catalog.checkpoint_ids()
        for s in scrapes:
            cid = int(value(s, "statelog_job_last_checkpoint_id"))
            assert cid in result.completed_checkpoints
            assert cid in ids  # every checkpoint is retained here
            meta = job.load_checkpoint(cid)
            assert value(s, "statelog_job_last_checkpoint_duration_seconds") == pytest.approx(meta.stats["duration_ms"] / 1000)
            assert value(s, "statelog_job_last_checkpoint_alignment_seconds") == pytest.approx(meta.stats["alignment_ms"] / 1000)
            assert value(s, "statelog_job_last_checkpoint_incremental_bytes") == meta.stats["incremental_bytes"]
            assert value(s, "statelog_job_changelog_tail_bytes") == meta.changelog_bytes
            assert value(s, "statelog_job_last_checkpoint_timestamp_seconds") == meta.timestamp_ms / 1000
            # completed so far: the published checkpoints of this run up to this one
            assert value(s, "statelog_job_checkpoints_completed_total") == len(
                [c for c in result.completed_checkpoints if c <= cid]
            )
    last = scrapes[-1]
    assert value(last, "statelog_job_restarts_total") == 1 == result.restarts
    assert value(last, "statelog_job_checkpoint_duration_seconds_count") >= completed[-1] - completed[0]
    records = {k[1]: v for k, v in last.items() if k[0] == "statelog_job_task_records_in_total"}
    assert records and any(v > 0 for v in records.values())
    first = {k[1]: v for k, v in scrapes[0].items() if k[0] == "statelog_job_task_records_in_total"}
    sources = [labels for labels in first if dict(labels)["vertex"].startswith("source:")]
    assert sources and all(records.get(lb, 0) >= first[lb] for lb in first), sorted(first)
    assert any(records[lb] > first[lb] for lb in sources)  # the sources read on between the scrapes
    assert all(("statelog_job_task_backpressured_seconds_total", lb) in last for lb in records)
    # records sent downstream per task: the sources' and the windows' (the sinks send nothing)
    out = {k[1]: v for k, v in last.items() if k[0] == "statelog_job_task_records_out_total"}
    assert set(out) == set(records) and all(out[lb] > 0 for lb in sources)
    # the job's records read: its sources' counters
    assert value(last, "statelog_job_records_in_total") == sum(records[lb] for lb in sources)
    assert ("statelog_job_records_per_second", ()) not in last  # a counter instead of a rate
    # event time: the windows' watermarks, the job's the lowest of its tasks'
    wms = {k[1]: v for k, v in last.items() if k[0] == "statelog_job_task_watermark_seconds"}
    windows = [lb for lb in records if "window" in dict(lb)["vertex"]]
    assert windows and all(lb in wms for lb in windows), (sorted(wms), windows)
    assert value(last, "statelog_job_watermark_seconds") == min(wms.values())
    # the window operator's state, per subtask, and the master's and workers' processes
    entries = [k for k in last if k[0] == "statelog_job_state_entries"]
    assert {dict(lb)["subtask"] for _n, lb in entries} == {"0", "1"}
    assert {dict(lb)["process"] for n, lb in last if n == "process_resident_memory_bytes"} >= {
        "master", "worker-0", "worker-1"}  # fmt: skip
    # local copies are on by default: each worker copied what it wrote, within the default budget
    made = {dict(lb)["process"]: v for (n, lb), v in last.items() if n == "statelog_job_local_copies_made_total"}
    assert set(made) == {"worker-0", "worker-1"} and all(v > 0 for v in made.values()), made
    budgets = [v for (n, _lb), v in last.items() if n == "statelog_job_local_copies_budget_bytes"]
    assert budgets and all(v == 1 << 30 for v in budgets)
    for name in ("statelog_job_local_copies_hits_total", "statelog_job_local_copies_misses_total",
                 "statelog_job_local_copies_evictions_total", "statelog_job_local_copies_bytes"):  # fmt: skip
        assert {dict(lb)["process"] for n, lb in last if n == name} == set(made), name


def test_a_taken_metrics_port_fails_the_start(file_root: RootSpec, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = make_env(file_root, metrics_port=port)
        jobs.build_clicks(env, tmp_path / "windows", 100)
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            env.execute("taken")
    with pytest.raises(ConfigError, match="metrics_port must be a TCP port"):
        make_env(file_root, metrics_port=-1)


def test_a_disk_store_job_reports_its_working_set_hits_and_misses(file_root: RootSpec, tmp_path: Path) -> None:
    """The runtime's tasks report the working set's figures as a consumer loop does: hits and
    misses of keys, misses of the windows' namespaced entries, per operator and subtask."""
    env = make_env(file_root, metrics_port=0, state_store="disk", state_dir=str(tmp_path / "ws"))
    jobs.build_clicks(env, tmp_path / "windows", 6_000, rate=2000)
    client = env.execute_async("hits")
    assert client.wait_running(1, timeout=60)
    server = client.master.metrics_server
    assert server is not None
    url = server.url

    def counters() -> dict[tuple[str, str], float] | None:
        m = scrape(url)
        found = {(n.removeprefix("statelog_job_state_cache_").removesuffix("_total"), dict(lb)["kind"]): v
                 for (n, lb), v in m.items() if n.startswith("statelog_job_state_cache_")}  # fmt: skip
        return found if found.get(("hits", "key"), 0) > 0 and found.get(("misses", "key"), 0) > 0 else None

    found = wait_until(counters, 60, "working-set hits and misses in a scrape")
    client.wait(120)
    assert set(found) == {("hits", "key"), ("misses", "key"), ("misses", "entry")}
