"""Lookups in a follower's replica: in-process, over HTTP (``statelog serve``), and SQL.

``python -m bench follow_lookups [--json] [--quick]``; ``python -m bench follow`` runs
:func:`measure_lookups` too, after its freshness figures.

A writer fills a ``ValueState<int64>`` of ``keys`` int keys and checkpoints once; a follower
(``statelog.follow``, "checkpoint", the whole state loaded) and a ``statelog serve --restore
eager`` process (the whole state loaded before it serves) read it. Per round:

* ``lookup_p50_us`` / ``lookup_p99_us``: ``follower.get`` of random keys, in this process;
* ``http_p50_ms`` / ``http_p99_ms``: ``GET /v1/state/...`` of random keys over one kept-alive
  connection (the server in its own process);
* ``http_batch_1000_ms``: ``POST /v1/lookup`` of 1,000 random keys (the median of its requests);
* ``flight_batch_1000_ms`` / ``flight_batch_1000_p99_ms``: a batch of 1,000 random keys over Arrow
  Flight (``--flight-port``, the same server process), ``statelog.query("grpc://...").get_many``:
  the call, the values decoded (the median and p99 of its calls);
* ``sql_count_s_first``: ``SELECT count(*)`` over the state's view, the first query (builds the
  view from the replica); ``sql_count_s``: the same query again (the view kept).

Over the rounds the median and its spread (``(max - min) / median``); ``load_average_1m``
(before and after) says how busy the machine was.
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import statelog
from bench.follow_seed import UID, seed

KEYS, ROUNDS, LOOKUPS, HTTP_LOOKUPS, BATCHES = 1_000_000, 3, 20_000, 2_000, 20
FLIGHT_BATCHES = 200
QUICK = {"keys": 20_000, "rounds": 1}
TOKEN = "bench-follow-lookups"
PROJECT = Path(__file__).resolve().parents[1]


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _write(root: str, keys: int) -> None:
    job = statelog.open(root)
    seed(job, keys)
    job.close()


def _in_process(root: str, keys: int) -> dict[str, float]:
    rng = random.Random(2)
    with statelog.follow(root, on_demand=False, poll_s=None) as f:
        get = f.get
        for k in rng.choices(range(keys), k=2_000):  # warm
            get(UID, "v", k)
        times = []
        gc.disable()  # (a collection is not a lookup's cost; it shows in the HTTP figures)
        try:
            for k in rng.choices(range(keys), k=LOOKUPS):
                t = time.perf_counter()
                get(UID, "v", k)
                times.append((time.perf_counter() - t) * 1e6)
        finally:
            gc.enable()
    return {"lookup_p50_us": _p(times, 0.5), "lookup_p99_us": _p(times, 0.99)}


def _serve(root: str) -> tuple[subprocess.Popen[str], str, int]:
    env = {**os.environ, "STATELOG_SERVE_TOKEN": TOKEN}
    # the whole state loaded before serving: the figures are a ready replica's, not a restore's
    proc = subprocess.Popen([sys.executable, "-m", "tools", "serve", root, "--port", "0", "--flight-port", "0",
                             "--restore", "eager", "--json"],
                            cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    found = re.search(r"http://([\d.]+):(\d+)/", line)
    flight = re.search(r"grpc://[\d.]+:\d+", line)
    if not found or not flight:
        proc.kill()
        raise RuntimeError(f"statelog serve printed no URL: {line!r}")
    return proc, found.group(1), int(found.group(2)), flight.group(0)


def _over_flight(url: str, keys: int) -> dict[str, float]:
    rng = random.Random(4)
    with statelog.query(url, token=TOKEN) as client:
        for _ in range(5):  # warm (the connection, the first lookups load on demand)
            client.get_many(UID, "v", rng.choices(range(keys), k=1000))
        times = []
        for _ in range(FLIGHT_BATCHES):
            batch = rng.choices(range(keys), k=1000)
            t = time.perf_counter()
            values = client.get_many(UID, "v", batch)
            times.append((time.perf_counter() - t) * 1e3)
            if len(values) != 1000 or values[0] is None:
                raise RuntimeError(f"a Flight batch of 1000 keys gave {len(values)} values, the first {values[0]!r}")
    return {"flight_batch_1000_ms": statistics.median(times), "flight_batch_1000_p99_ms": _p(times, 0.99)}


def _call(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    out = json.loads(resp.read())
    if resp.status != 200:
        raise RuntimeError(f"{method} {path}: {resp.status} {out}")
    return out


def _over_http(root: str, keys: int) -> dict[str, float]:
    proc, host, port, flight_url = _serve(root)
    try:
        flight = _over_flight(flight_url, keys)
        conn = http.client.HTTPConnection(host, port, timeout=600)
        rng = random.Random(3)
        for k in rng.choices(range(keys), k=200):  # warm (the first lookups load on demand)
            _call(conn, "GET", f"/v1/state/{UID}/v?key={k}")
        times = []
        for k in rng.choices(range(keys), k=HTTP_LOOKUPS):
            t = time.perf_counter()
            _call(conn, "GET", f"/v1/state/{UID}/v?key={k}")
            times.append((time.perf_counter() - t) * 1e3)
        batches = []
        for _ in range(BATCHES):
            body = {"operator": UID, "state": "v", "keys": rng.choices(range(keys), k=1000)}
            t = time.perf_counter()
            _call(conn, "POST", "/v1/lookup", body)
            batches.append((time.perf_counter() - t) * 1e3)
        sql = {"query": f"SELECT count(*) FROM {UID}__v"}
        t = time.perf_counter()
        rows = _call(conn, "POST", "/v1/sql", sql)["rows"]
        first = time.perf_counter() - t
        if rows != [[keys]]:
            raise RuntimeError(f"SELECT count(*) gave {rows}, expected [[{keys}]]")
        again = []
        for _ in range(5):
            t = time.perf_counter()
            _call(conn, "POST", "/v1/sql", sql)
            again.append(time.perf_counter() - t)
        conn.close()
    finally:
        proc.terminate()
        proc.wait(60)
    return {"http_p50_ms": _p(times, 0.5), "http_p99_ms": _p(times, 0.99),
            "http_batch_1000_ms": statistics.median(batches),
            "sql_count_s_first": first, "sql_count_s": statistics.median(again), **flight}  # fmt: skip


def measure_lookups(root: str | None = None, keys: int = KEYS, rounds: int = ROUNDS,
                    progress: bool = False) -> dict[str, Any]:
    """The lookup figures (see the module's doc) over ``rounds`` rounds, each on a fresh root
    (under ``root`` when given, else a temporary directory) of ``keys`` keys."""
    per_round = []
    load_before = os.getloadavg()[0]
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-follow-lookups-") as tmp:
            r = root.rstrip("/") + f"/lookups-{i}-{time.time_ns()}" if root else (Path(tmp) / "root").as_uri()
            _write(r, keys)
            per_round.append({**_in_process(r, keys), **_over_http(r, keys)})
        if progress:
            print(f"round {i + 1}/{rounds}: {per_round[-1]}", flush=True)
    out: dict[str, Any] = {"lookup_keys": keys, "lookup_rounds": rounds,
                           "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}  # fmt: skip
    for name in per_round[0]:
        values = [r[name] for r in per_round]
        med = statistics.median(values)
        out[name] = round(med, 6)
        out[name + "_spread"] = round((max(values) - min(values)) / med, 3) if med else 0.0
    return out


def run(quick: bool = False, root: str | None = None, progress: bool = True) -> dict[str, Any]:
    return measure_lookups(root, **QUICK, progress=progress) if quick else measure_lookups(root, progress=progress)


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv, progress="--json" not in sys.argv), sort_keys=True))
