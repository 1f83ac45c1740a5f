"""``statelog serve --metrics-port``: Prometheus metrics of requests, latency and the replica's lag."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

import statelog
from statelog import ValueStateDescriptor
from tests.support.s3server import RootSpec
from tests.support.wait import wait_until

PROJECT = Path(__file__).resolve().parents[3]
TOKEN = "s3cr3t-metrics-token"
UID = "op"


class Writer:
    def __init__(self, root: RootSpec) -> None:
        self.job = statelog.open(root.url, store_options=root.options, max_parallelism=16)
        self.backend = self.job.backend(UID, restore="none")
        self.count = self.backend.get_state(ValueStateDescriptor("count", pa.int64()))

    def update(self, step: int) -> int:
        for key in (1, 2):
            self.backend.set_current_key(key)
            self.count.update(step * 10 + key)
        return self.job.checkpoint().checkpoint_id


def http(url: str, path: str, token: str = TOKEN, body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=body, method="GET" if body is None else "POST")
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip


def requests(m: Samples, kind: str, outcome: str) -> float:
    return m[("statelog_serve_requests_total", (("kind", kind), ("outcome", outcome)))]


def latency_count(m: Samples, kind: str) -> float:
    return m[("statelog_serve_request_duration_seconds_count", (("kind", kind),))]


def start(root: RootSpec, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "STATELOG_SERVE_TOKEN": TOKEN}
    return subprocess.Popen(
        [sys.executable, "-m", "tools", "serve", root.url, "--port", "0", "--poll", "0.05", "--json", *extra],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_requests_latency_and_lag_are_scraped(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    first = w.update(1)
    server = start(file_root, tmp_path, "--metrics-port", "0")
    try:
        out = json.loads(server.stdout.readline() if server.stdout else "{}")
        url, metrics = out["url"], out["metrics_url"]
        m = scrape(metrics)
        assert m[("statelog_serve_checkpoint_id", ())] == first
        assert m[("statelog_serve_replica_lag_checkpoints", ())] == 0
        assert m[("statelog_serve_replica_lag_seconds", ())] >= 0
        assert m[("statelog_serve_follower_restores_total", ())] == 1
        assert requests(m, "lookup", "ok") == 0 and latency_count(m, "lookup") == 0

        for _ in range(3):
            assert http(url, "v1/state/op/count?key=1")[0] == 200
        body = json.dumps({"operator": UID, "state": "count", "keys": [1, 2]}).encode()
        assert http(url, "v1/lookup", body=body)[0] == 200
        assert http(url, "v1/state/op/count?key=%7Bbad")[0] == 400
        assert http(url, "v1/state/op/count?key=1", token="wrong")[0] == 401
        assert http(url, "v1/sql", body=json.dumps({"query": "SELECT 1"}).encode())[0] == 200
        m = scrape(metrics)
        assert requests(m, "lookup", "ok") == 3
        assert requests(m, "lookup", "client_error") == 1
        assert requests(m, "lookup", "refused") == 1
        assert requests(m, "batch", "ok") == 1
        assert requests(m, "sql", "ok") == 1
        assert requests(m, "lookup", "server_error") == 0
        assert latency_count(m, "lookup") == 5 and latency_count(m, "batch") == 1
        assert m[("statelog_serve_request_duration_seconds_sum", (("kind", "lookup"),))] > 0

        second = w.update(2)
        wait_until(lambda: scrape(metrics)[("statelog_serve_checkpoint_id", ())] == second, 30,
                   "the served checkpoint id in the metrics")  # fmt: skip
        assert scrape(metrics)[("statelog_serve_follower_restores_total", ())] == 1  # followed, not restored
    finally:
        server.terminate()
        server.wait(30)
    w.job.close()


def test_a_taken_metrics_port_is_one_line_and_exit_2(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    w.update(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = start(file_root, tmp_path, "--metrics-port", str(taken.getsockname()[1]))
        _, err = server.communicate(timeout=60)
    assert server.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot serve metrics on 127.0.0.1:" in lines[0] and "metrics" in lines[0]
    w.job.close()
