"""``statelog serve --flight-port``: a follower's state over Arrow Flight on loopback and through
``statelog.query("grpc://...")``; the token; clear errors after which the server still answers.

Most tests run the Flight server in this process over a real follower of a ``file://`` root a
real backend wrote (the answers are compared with that follower's ``get``); the last ones run
``statelog serve`` as a process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import statelog
from statelog.errors import QueryError
from statelog.flight_client import FlightQueryClient
from statelog.following.arrow_values import python_values
from tests.support.s3server import RootSpec
from tests.support.state_kinds import every_state_kind
from tests.support.wait import wait_until
from tools.serve.flight import FlightStateServer, start_flight
from tools.serve.server import make_server

PROJECT = Path(__file__).resolve().parents[3]
TOKEN = "s3cr3t-flight-token"
UID = "op"
KEYS: list[Any] = [*range(1000), "user-a", (3, "x")]
NAMESPACES = [None, "w1"]


class Writer:
    """A job with every state kind; :meth:`update` writes every key of KEYS (both namespaces)."""

    def __init__(self, root: RootSpec) -> None:
        self.job = statelog.open(root.url, store_options=root.options, max_parallelism=16)
        self.backend = self.job.backend(UID, restore="none")
        self.states = {d.name: self.backend.get_state(d) for d in every_state_kind(10**9)}

    def update(self, step: int) -> int:
        states = self.states
        for i, key in enumerate(KEYS):
            self.backend.set_current_key(key)
            for ns in NAMESPACES:
                for st in states.values():
                    st.set_namespace(ns)
                v = step * 10_000 + i
                states["count"].update(v)
                states["seen"].add(f"e{v}")
                states["attrs"].put(f"a{v % 4}", v)
                states["total"].add(v)
                states["avg"].add(v)
                states["blob"].update({"v": v, "raw": bytes([v % 256, 0]), "f": v / 4})
                states["ttl_v"].update(v)
                states["ttl_l"].add(v)
                states["ttl_m"].put(f"m{v % 3}", [v])
                states["pmap"].put((v % 2, "k"), str(v))
        return self.job.checkpoint().checkpoint_id


def write(root: RootSpec) -> Writer:
    w = Writer(root)
    w.update(1)
    return w


@contextlib.contextmanager
def flight_server(root: RootSpec) -> Iterator[tuple[statelog.Follower, FlightStateServer, Any]]:
    """A follower of ``root``, the HTTP server's shared parts and a Flight server on loopback."""
    follower = statelog.follow(root.url, store_options=root.options, poll_s=0.05)
    http = make_server(follower, "127.0.0.1", 0, TOKEN)
    server = start_flight(follower, "127.0.0.1", 0, TOKEN, http.sql, http.scans, http.metrics)
    try:
        wait_until(lambda: follower.checkpoint_id is not None, 60, "the follower's first state")
        yield follower, server, http.metrics
    finally:
        server.shutdown()
        http.server_close()
        follower.close()


@pytest.fixture
def served(file_root: RootSpec) -> Iterator[tuple[statelog.Follower, FlightQueryClient, Any, Any]]:
    job = write(file_root)
    with flight_server(file_root) as (follower, server, metrics):
        client = statelog.query(f"grpc://127.0.0.1:{server.port}", token=TOKEN)
        assert isinstance(client, FlightQueryClient)
        yield follower, client, job, metrics
        client.close()
    job.job.close()


def test_lookups_of_every_state_kind_equal_the_followers(served: Any) -> None:
    follower, client, _, _ = served
    names = [d.name for d in every_state_kind(10**9)]
    for name in names:
        for ns in NAMESPACES:
            assert client.get_many(UID, name, KEYS, namespace=ns) == [follower.get(UID, name, k, ns) for k in KEYS], name
        assert client.get(UID, name, (3, "x")) == follower.get(UID, name, (3, "x"))
    assert client.get(UID, "blob", 7)["raw"] == bytes([10_007 % 256, 0])  # bytes come back as bytes
    assert client.get(UID, "pmap", 1) == {(1, "k"): "10001"}  # a tuple map key comes back as a tuple
    assert sorted(client.states()) == sorted((UID, n) for n in names)
    position = client.position()
    assert position["checkpoint_id"] == follower.checkpoint_id and position["operators"] == [UID]


def test_a_batch_of_1000_keys_is_one_arrow_table(served: Any) -> None:
    follower, client, _, metrics = served
    keys = [*range(999), 10**6]  # the last one absent
    table = client.lookup(UID, "count", keys, namespace="w1")
    assert table.schema.names == ["key", "namespace", "value", "found"] and table.num_rows == 1000
    assert [str(table.schema.field(n).type) for n in table.schema.names] == ["int64", "string", "int64", "bool"]
    assert json.loads(table.schema.metadata[b"encoding"]) == {"key": "arrow", "namespace": "arrow", "value": "arrow"}
    assert table.column("key").to_pylist() == keys and set(table.column("namespace").to_pylist()) == {"w1"}
    assert table.column("found").to_pylist() == [True] * 999 + [False]
    assert table.column("value").to_pylist() == [follower.get(UID, "count", k, "w1") for k in keys[:999]] + [None]
    meta = table.schema.metadata
    assert json.loads(meta[b"checkpoint_id"]) == follower.checkpoint_id and json.loads(meta[b"flushed_records"]) == 0
    assert metrics.requests.labels("batch", "ok")._value.get() >= 1
    # keys of several types, values that are not plain: JSON text, decoded by python_values
    mixed = client.lookup(UID, "count", [1, "user-a", (3, "x"), "absent"])
    assert json.loads(mixed.schema.metadata[b"encoding"]) == {"key": "json", "namespace": "arrow", "value": "arrow"}
    assert mixed.column("key").to_pylist() == ["1", '"user-a"', '[3, "x"]', '"absent"']
    assert mixed.column("namespace").type == pa.null() and mixed.column("found").to_pylist() == [True] * 3 + [False]
    assert python_values(mixed, "key") == [1, "user-a", (3, "x"), "absent"]
    maps = client.lookup(UID, "pmap", [1, (3, "x")])
    assert json.loads(maps.schema.metadata[b"encoding"])["value"] == "json"
    assert python_values(maps, "value") == [follower.get(UID, "pmap", k) for k in (1, (3, "x"))]


def test_scans_by_key_range_and_key_group(served: Any) -> None:
    follower, client, _, _ = served
    ints = [k for k in KEYS if isinstance(k, int)]
    got = list(client.scan(UID, "count", start=10, end=400, namespace=None, limit=100))  # 4 pages
    assert sorted(got) == sorted((k, None, follower.get(UID, "count", k)) for k in ints if 10 <= k < 400)
    group = statelog.key_group_of(5, 16)
    table = client.scan_table(UID, "count", key_group=group, limit=50)
    expected = {(k, ns) for k in KEYS for ns in NAMESPACES if statelog.key_group_of(k, 16) == group}
    got_keys = list(zip(python_values(table, "key"), python_values(table, "namespace"), strict=True))
    assert sorted(map(repr, got_keys)) == sorted(map(repr, expected)) and len(got_keys) == len(expected)
    assert python_values(table, "value") == [follower.get(UID, "count", k, ns) for k, ns in got_keys]
    assert b"next" not in table.schema.metadata and json.loads(table.schema.metadata[b"checkpoint_id"]) == follower.checkpoint_id


def test_sql_is_an_arrow_stream(served: Any) -> None:
    follower, client, _, _ = served
    table = client.sql("SELECT count(*) AS n FROM op__count")
    assert table.to_pylist() == [{"n": len(KEYS) * len(NAMESPACES)}]
    assert json.loads(table.schema.metadata[b"checkpoint_id"]) == follower.checkpoint_id
    small = client.sql("SELECT * FROM op__count", max_rows=5)
    assert small.num_rows == 5 and json.loads(small.schema.metadata[b"truncated"]) is True


def test_the_answers_move_with_checkpoints(served: Any) -> None:
    follower, client, job, _ = served
    second = job.update(2)
    wait_until(lambda: client.position()["checkpoint_id"] == second, 30, "the server at the new checkpoint")
    assert client.get(UID, "count", 1) == 20_001 and client.get_many(UID, "count", [0, 2]) == [20_000, 20_002]


@pytest.mark.parametrize("token", [None, "wrong-token", "Basic abc"])
def test_a_wrong_or_missing_token_is_refused_and_logged_without_the_token(
    served: Any, token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    _, client, _, metrics = served
    raw = fl.FlightClient(client.url)
    headers = [] if token is None else [(b"authorization", (token if " " in token else f"Bearer {token}").encode())]
    options = fl.FlightCallOptions(headers=headers)
    ticket = fl.Ticket(json.dumps({"lookup": {"operator": UID, "state": "count", "keys": [1]}}).encode())
    with caplog.at_level("WARNING", logger="tools.serve"):
        with pytest.raises(fl.FlightUnauthenticatedError, match="authorization: Bearer <token>"):
            raw.do_get(ticket, options).read_all()
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(raw.list_flights(b"", options))
    if token is not None and " " not in token:
        with pytest.raises(QueryError, match="unauthorized \\(wrong token\\)") as e:
            statelog.query(client.url, token=token).get(UID, "count", 1)
        assert e.value.status == 401 and token not in str(e.value)
    assert "refused Flight DO_GET" in caplog.text and TOKEN not in caplog.text and "wrong-token" not in caplog.text
    assert metrics.requests.labels("other", "refused")._value.get() >= 2
    assert client.get(UID, "count", 1) == 10_001  # the right token still reads
    raw.close()


@pytest.mark.parametrize(("call", "status", "message"), [
    (lambda c: c.get(UID, "nope", 1), 404, "not found: .*has no state 'nope'"),
    (lambda c: c.get("nope", "count", 1), 404, "not found: .*no state of operator 'nope'"),
    (lambda c: c.get_many(UID, "count", [{"a": 1}]), 400, "bad request: keys\\[0\\]: expected"),
    (lambda c: list(c.scan(UID, "count", key_group=99)), 400, "bad request: key_group: expected 0..15"),
    (lambda c: c.sql("DELETE FROM op__count"), 400, "bad request: "),
    (lambda c: c.sql("SELECT * FROM nope__x"), 400, "bad request: no view"),
    (lambda c: c._get("lookup", {"operator": UID}), 400, "bad request: a lookup ticket takes operator, state, keys"),
    (lambda c: c._get("mystery", {}), 400, "bad request: expected a ticket"),
])  # fmt: skip
def test_bad_requests_get_a_clear_error_and_the_server_stays_up(served: Any, call: Any, status: int, message: str) -> None:
    _, client, _, metrics = served
    with pytest.raises(QueryError, match=message) as e:
        call(client)
    assert e.value.status == status and "Traceback" not in str(e.value)
    assert client.get(UID, "count", 1) == 10_001  # still serving
    assert metrics.requests.labels("other", "client_error")._value.get() + sum(
        metrics.requests.labels(k, "client_error")._value.get() for k in ("batch", "scan", "sql")) >= 1


def test_flight_descriptors_describe_the_states(served: Any) -> None:
    _, client, _, _ = served
    raw = fl.FlightClient(client.url)
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    info = raw.get_flight_info(fl.FlightDescriptor.for_path(UID, "count"), options)
    assert info.schema.names == ["key", "namespace", "value"]
    page = raw.do_get(info.endpoints[0].ticket, options).read_all()  # the first scan page
    assert page.num_rows == 1000 and json.loads(page.schema.metadata[b"next"]) is not None
    with pytest.raises(fl.FlightServerError, match="not found: operator 'op' has no state 'nope'") as e:
        raw.get_flight_info(fl.FlightDescriptor.for_path(UID, "nope"), options)
    assert e.value.extra_info == b"404"
    with pytest.raises(fl.FlightServerError, match="bad request: expected a path descriptor"):
        raw.get_flight_info(fl.FlightDescriptor.for_command(b"x"), options)
    assert [i.descriptor.path for i in raw.list_flights(b"other-operator", options)] == []
    assert [a.type for a in raw.list_actions(options)] == ["position"]
    raw.close()


def test_the_http_client_has_the_same_methods(served: Any) -> None:
    follower, client, _, _ = served
    http = make_server(follower, "127.0.0.1", 0, TOKEN)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        h = statelog.query(f"http://127.0.0.1:{http.server_address[1]}/", token=TOKEN)
        for name in ("get", "get_many", "read", "read_many", "scan", "scan_pages", "position", "sql"):
            assert callable(getattr(h, name)) and callable(getattr(client, name))
        assert h.get_many(UID, "blob", KEYS[:50]) == client.get_many(UID, "blob", KEYS[:50])
        assert list(h.scan(UID, "seen", start=0, end=30)) == list(client.scan(UID, "seen", start=0, end=30))
        assert h.position()["checkpoint_id"] == client.position()["checkpoint_id"]
    finally:
        http.shutdown()
        http.server_close()


def test_an_unreachable_server_is_a_clear_error() -> None:
    client = statelog.query("grpc://127.0.0.1:1", token=TOKEN, timeout=5)
    with pytest.raises(QueryError, match="cannot reach grpc://127.0.0.1:1: .*statelog serve --flight-port") as e:
        client.position()
    assert e.value.status is None and TOKEN not in str(e.value)


# -- statelog serve --flight-port as a process ----------------------------------------------------


def test_statelog_serve_flight_port_serves_both_from_one_follower(file_root: RootSpec, tmp_path: Path) -> None:
    job = write(file_root)
    env = {**os.environ, "STATELOG_SERVE_TOKEN": TOKEN}
    server = subprocess.Popen(
        [sys.executable, "-m", "tools", "serve", file_root.url, "--port", "0", "--flight-port", "0", "--poll", "0.05", "--json"],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        out = json.loads(server.stdout.readline() if server.stdout else "{}")
        assert re.fullmatch(r"grpc://127\.0\.0\.1:\d+", out["flight_url"]), out
        flight = statelog.query(out["flight_url"], token=TOKEN)
        http = statelog.query(out["url"], token=TOKEN)
        assert flight.get_many(UID, "count", [1, 2]) == http.get_many(UID, "count", [1, 2]) == [10_001, 10_002]
        assert flight.sql("SELECT count(*) AS n FROM op__count").column("n").to_pylist() == [len(KEYS) * 2]
    finally:
        server.terminate()
        server.wait(30)
    job.job.close()


@pytest.mark.parametrize("port", ["70000", "x", "taken"])
def test_a_bad_flight_port_exits_2_with_one_line(file_root: RootSpec, port: str) -> None:
    job = write(file_root)
    env = {**os.environ, "STATELOG_SERVE_TOKEN": TOKEN}
    with contextlib.ExitStack() as stack:
        port_in_use = port == "taken"
        if port_in_use:
            other = stack.enter_context(socket.socket())
            other.bind(("127.0.0.1", 0))
            other.listen()
            port = str(other.getsockname()[1])
        done = subprocess.run([sys.executable, "-m", "tools", "serve", file_root.url, "--port", "0", "--flight-port", port],
                              cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.splitlines()
    expected = ("cannot serve Arrow Flight on 127.0.0.1:" if port_in_use else "--flight-port: expected a TCP port 0..65535")
    assert len(lines) == 1 and expected in lines[0] and TOKEN not in lines[0], lines
    assert not port_in_use or "Address already in use; pick another --flight-port (0: any free port)" in lines[0], lines
    job.job.close()


def test_before_the_first_checkpoint_unavailable_then_the_state(file_root: RootSpec) -> None:
    w = Writer(file_root)  # a job root without a completed checkpoint
    follower = statelog.follow(file_root.url, poll_s=0.05)
    http = make_server(follower, "127.0.0.1", 0, TOKEN)
    server = start_flight(follower, "127.0.0.1", 0, TOKEN, http.sql, http.scans, http.metrics)
    try:
        client = statelog.query(f"grpc://127.0.0.1:{server.port}", token=TOKEN)
        with pytest.raises(QueryError, match="unavailable: .*no completed checkpoint") as e:
            client.get(UID, "count", 1)
        assert e.value.status == 503
        w.update(1)
        wait_until(lambda: client.position()["checkpoint_id"] is not None, 30, "the first checkpoint served")
        assert client.get(UID, "count", 1) == 10_001
        client.close()
    finally:
        server.shutdown()
        http.server_close()
        follower.close()
        w.job.close()
