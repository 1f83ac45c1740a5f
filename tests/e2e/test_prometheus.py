"""The metrics, the alert rules and the Grafana dashboard of docs/monitoring/ against a real Prometheus.

One Prometheus server for the session (``tests/support/prometheus.py``: Debian's package,
scrape and evaluation every second, the rules of ``docs/monitoring/alerts.yml`` with the
checkpoint-age threshold at 3 s). It scrapes a running runtime job, a consumer loop on
``statelog.open(metrics_port=0)`` and a materializer daemon; every metric name the dashboard
uses is then in the server and every panel's query has data; the rules pass ``promtool check
rules`` and their unit tests (``promtool test rules``); a consumer loop that
stops checkpointing makes the checkpoint-age alert fire, and its next checkpoint resolves it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from materializer.daemon.loop import MaterializerDaemon
from runtime.errors import JobCancelledError
from statelog import ValueStateDescriptor
from statelog.store import open_store
from tests.support import jobs
from tests.support.jobs import make_env
from tests.support.prometheus import CHECKPOINT_AGE_S, RULES, PrometheusServer
from tests.support.s3server import RootSpec
from tests.support.wait import wait_until

pytestmark = pytest.mark.xdist_group("prometheus")  # one server per session

DOCS = Path(__file__).resolve().parents[2] / "docs"
DASHBOARD = DOCS / "monitoring" / "grafana-dashboard.json"
MONITORING = DOCS / "monitoring.md"
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def dashboard_exprs() -> list[str]:
    exprs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(DASHBOARD.read_text()))
    return exprs


def dashboard_names() -> set[str]:
    return {n for e in dashboard_exprs() for n in re.findall(r"\b((?:statelog|process)_[a-z_]+)", e)}


def test_the_rules_pass_promtool(prometheus: PrometheusServer) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool comes with Debian's prometheus package"
    for path in (RULES, prometheus.rules):  # the shipped rules and the session's copy
        out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "SUCCESS: 7 rules found" in out.stdout, out.stdout + out.stderr
    # each alert fires on synthetic series, and not on healthy ones (docs/monitoring/alerts_test.yml)
    out = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=RULES.parent, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    loaded = [r["name"] for g in prometheus.api("rules")["groups"] for r in g["rules"]]
    assert sorted(loaded) == sorted(["StatelogCheckpointAge", "StatelogCheckpointsFailing", "StatelogMaterializationLag",
                                     "StatelogChangelogTailGrowth", "StatelogMaterializerLeaseLost",
                                     "StatelogJobNotRunning", "StatelogJobRestarts"])  # fmt: skip


def loop_step(job: statelog.StateJob, backends: list, n: int, round_: int) -> None:
    """One round of a consumer loop: records into two backends (memory and disk), the loop's
    own figures, a checkpoint."""
    for b in backends:
        state = b.get_state(COUNT)
        for k in range(n):
            b.set_current_key(f"user-{round_ * n + k}")
            state.update(k)
    job.metrics.records_in(n)
    job.metrics.records_out(n // 2)
    job.metrics.watermark(1_800_000_000_000 + round_ * 1000)
    job.metrics.kafka_lag("clicks", 0, 100 - round_)
    job.checkpoint()


def test_prometheus_scrapes_a_job_a_consumer_loop_and_a_daemon(
    prometheus: PrometheusServer, file_root: RootSpec, tmp_path: Path
) -> None:
    env = make_env(file_root, metrics_port=0, checkpoint_interval_s=0.3)
    jobs.build_clicks(env, tmp_path / "windows", 200_000, rate=2000)
    client = env.execute_async("prom-runtime")
    loop_root = (tmp_path / "loop").as_uri()
    job = statelog.open(loop_root, metrics_port=0, metrics_job="prom-loop", state_dir=str(tmp_path / "state"))
    store = open_store(loop_root)
    daemon = MaterializerDaemon(store, interval_s=0.001, poll_s=0.05, metrics_port=0, owner="prom-daemon")
    stop = threading.Event()
    t = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    try:
        assert client.wait_running(1, timeout=60)
        server = client.master.metrics_server
        assert server is not None and job.metrics.url is not None
        backends = [job.backend("counter"), job.backend("sessions", state_store="disk")]
        loop_step(job, backends, 50, 0)
        t.start()
        wait_until(lambda: daemon.metrics_server is not None, 30, "the daemon's metrics server")
        assert daemon.metrics_server is not None
        prometheus.add_target("prom-runtime", server.url)
        prometheus.add_target("prom-loop", job.metrics.url)
        prometheus.add_target("prom-daemon", daemon.metrics_server.url)
        round_ = 1

        def scraped() -> bool:  # every target scraped after the figures that come with time
            nonlocal round_
            loop_step(job, backends, 50, round_)
            round_ += 1
            checks = [
                'statelog_job_task_records_out_total{job="prom-runtime"} > 0',
                'statelog_job_records_in_total{job="prom-runtime"} > 0',
                'statelog_job_state_entries{job="prom-runtime"} > 0',
                'statelog_job_last_checkpoint_timestamp_seconds{job="prom-runtime"}',
                'statelog_job_checkpoint_duration_seconds_count{job="prom-runtime"} > 0',
                'process_resident_memory_bytes{job="prom-runtime", process="worker-1"}',
                'statelog_job_kafka_lag_records{job="prom-loop", topic="clicks", partition="0"}',
                'statelog_job_state_disk_bytes{job="prom-loop", operator="sessions"}',
                'statelog_job_state_cache_misses_total{job="prom-loop", operator="sessions", kind="key"} > 0',
                'statelog_job_state_cache_hits_total{job="prom-loop", operator="sessions", kind="key"}',
                'statelog_job_state_entries{job="prom-loop", operator="counter"} > 0',
                'statelog_materializer_lag_checkpoints{owner="prom-daemon"}',
                'statelog_materializer_materialization_duration_seconds_count{owner="prom-daemon"} > 0',
                'statelog_materializer_last_success_timestamp_seconds{owner="prom-daemon"}',
            ]
            return all(prometheus.query(q) for q in checks)

        wait_until(scraped, 90, "Prometheus scraping the job, the consumer loop and the daemon", interval=0.5)
        # the values Prometheus holds are the endpoints' (labels job/owner on every series)
        up = {r["metric"]["target"]: r["value"][1] for r in prometheus.query('up{target=~"prom-.*"}')}
        assert up == {"prom-runtime": "1", "prom-loop": "1", "prom-daemon": "1"}
        for name in ("prom-runtime", "prom-loop", "prom-daemon"):
            unlabelled = prometheus.query(f'{{target="{name}", job="", owner=""}}')
            assert unlabelled == [], [r["metric"] for r in unlabelled]  # up and scrape_* carry the scrape's labels
        ids = prometheus.query('statelog_job_last_checkpoint_id{job="prom-loop"}')
        latest = job.latest_checkpoint()
        assert latest is not None and 1 <= float(ids[0]["value"][1]) <= latest.checkpoint_id
        names = prometheus.names()
        missing = sorted(dashboard_names() - names)
        assert not missing, f"the dashboard uses metrics no scrape holds: {missing}"
        assert "statelog_job_records_per_second" not in names  # a counter, no server-side rate
        # every panel's query is valid PromQL (an error fails api()) and has data for these jobs
        # once rates have two scrapes (the job variable: all of them)
        empty: list[str] = []

        def every_panel_has_data() -> bool:
            nonlocal round_, empty
            loop_step(job, backends, 50, round_)
            round_ += 1
            empty = [e for e in dashboard_exprs() if not prometheus.query(e.replace("$job", "prom-.*"))]
            return not empty

        try:
            wait_until(every_panel_has_data, 60, "data for every panel of the dashboard", interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}: {empty}") from None
        # every metric the three endpoints serve is listed in docs/monitoring.md
        served = {r["metric"]["__name__"] for r in prometheus.query('{target=~"prom-.*"}')}
        documented = MONITORING.read_text()
        undocumented = sorted(
            n for n in served if not n.startswith(("up", "scrape_"))
            and re.sub(r"_(bucket|sum|count|created)$", "", n) not in documented
            and n not in documented
        )  # fmt: skip
        assert not undocumented, f"served but not in docs/monitoring.md: {undocumented}"
    finally:
        for name in ("prom-runtime", "prom-loop", "prom-daemon"):
            prometheus.remove_target(name)
        client.cancel()
        stop.set()
        t.join(30)
        job.close()
        store.close()
        with pytest.raises(JobCancelledError):
            client.wait(60)


def test_a_stalled_checkpoint_fires_the_checkpoint_age_alert_and_a_resumed_job_resolves_it(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    job = statelog.open((tmp_path / "root").as_uri(), metrics_port=0, metrics_job="prom-stall")
    try:
        assert job.metrics.url is not None
        b = job.backend("counter")
        loop_step(job, [b], 10, 0)
        prometheus.add_target("prom-stall", job.metrics.url)
        round_ = 1

        def checkpointing() -> bool:  # every 0.5 s: no alert, once scraped three times
            nonlocal round_
            loop_step(job, [b], 10, round_)
            round_ += 1
            r = prometheus.query('count_over_time(statelog_job_last_checkpoint_id{job="prom-stall"}[1m])')
            return bool(r) and float(r[0]["value"][1]) >= 3 and not prometheus.alerts("StatelogCheckpointAge",
                                                                                       job="prom-stall")  # fmt: skip

        wait_until(checkpointing, 60, "three scrapes of a checkpointing loop and no alert", interval=0.5)
        # the loop stalls: no checkpoint for more than CHECKPOINT_AGE_S seconds
        firing = wait_until(lambda: [a for a in prometheus.alerts("StatelogCheckpointAge", job="prom-stall")
                                     if a["state"] == "firing"], 60, "the checkpoint-age alert firing")  # fmt: skip
        assert float(firing[0]["value"]) > CHECKPOINT_AGE_S
        assert firing[0]["labels"]["severity"] == "critical"
        # resumed: checkpointing again resolves it
        wait_until(checkpointing, 30, "the checkpoint-age alert resolved by a resumed loop", interval=0.5)
    finally:
        prometheus.remove_target("prom-stall")
        job.close()
