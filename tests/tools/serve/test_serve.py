"""``statelog serve`` as a process: a follower's state over HTTP/JSON and through
``statelog.query``; the token; clear errors after which the server still answers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import PICKLE, ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.errors import QueryError
from tests.support.s3server import RootSpec
from tests.support.wait import wait_until

PROJECT = Path(__file__).resolve().parents[3]
TOKEN = "s3cr3t-serve-token"
UID = "op"
KEYS: list[Any] = [1, 2, "user-a", (3, "x")]
DESCRIPTORS = [
    ValueStateDescriptor("count", pa.int64()),
    ListStateDescriptor("seen", pa.string()),
    MapStateDescriptor("pmap", pa.string(), key_type=PICKLE),
    ValueStateDescriptor("raw", pa.binary()),
    ValueStateDescriptor("blob", PICKLE),
]


class Writer:
    def __init__(self, root: RootSpec) -> None:
        self.job = statelog.open(root.url, store_options=root.options, max_parallelism=16)
        self.backend = self.job.backend(UID, restore="none")
        self.states = {d.name: self.backend.get_state(d) for d in DESCRIPTORS}

    def update(self, step: int) -> int:
        s = self.states
        for i, key in enumerate(KEYS):
            self.backend.set_current_key(key)
            for ns in (None, "w1"):
                for st in s.values():
                    st.set_namespace(ns)
                v = step * 10 + i
                s["count"].update(v)
                s["seen"].add(f"e{v}")
                s["pmap"].put((v % 2, "k"), str(v))
                s["raw"].update(bytes([v % 256, 0, 255]))
                s["blob"].update({"v": v, "t": [v, "x"], "f": v / 4})  # (a tuple would come back as a list)
        return self.job.checkpoint().checkpoint_id

    def view(self, ns: Any = None) -> dict[tuple[str, Any], Any]:
        out = {}
        for key in KEYS:
            self.backend.set_current_key(key)
            for name, st in self.states.items():
                st.set_namespace(ns)
                out[(name, key)] = dict(st.items()) if name == "pmap" else st.get() if name == "seen" else st.value()
        return out


@contextlib.contextmanager
def serve(root: str, tmp_path: Path, *extra: str, token: str | None = TOKEN) -> Iterator[tuple[str, Path]]:
    env = {k: v for k, v in os.environ.items() if k != "STATELOG_SERVE_TOKEN"}
    if token is not None:
        env["STATELOG_SERVE_TOKEN"] = token
    errors = tmp_path / "serve.stderr"
    with errors.open("w") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "tools", "serve", root, "--port", "0", "--poll", "0.05", *extra],
            cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
        try:
            line = server.stdout.readline() if server.stdout else ""
            found = re.search(r"serving .* at (http://127\.0\.0\.1:\d+/) ", line) or re.search(
                r'"url": "(http://127\.0\.0\.1:\d+/)"', line)  # --json
            assert found, f"no URL printed: {line!r}; stderr: {errors.read_text()}"
            yield found.group(1), errors
        finally:
            server.terminate()
            server.wait(30)


def http(url: str, path: str, token: str | None = TOKEN, body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=body, method="GET" if body is None else "POST")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def served_view(client: statelog.QueryClient, ns: Any = None) -> dict[tuple[str, Any], Any]:
    return {(d.name, key): client.get(UID, d.name, key, ns) for d in DESCRIPTORS for key in KEYS}


def test_values_equal_the_writers_and_move_with_checkpoints(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    first = w.update(1)
    with serve(file_root.url, tmp_path) as (url, _):
        client = statelog.query(url, token=TOKEN)
        assert client.position()["checkpoint_id"] == first and client.position()["operators"] == [UID]
        assert served_view(client) == w.view() and served_view(client, "w1") == w.view("w1")
        assert client.get(UID, "raw", 1) == bytes([10, 0, 255])  # bytes come back as bytes
        assert client.get(UID, "pmap", 1) == {(0, "k"): "10"}  # a tuple map key comes back as a tuple
        assert client.get_many(UID, "count", KEYS) == [w.view()[("count", k)] for k in KEYS]
        assert client.get_many(UID, "count", [*KEYS, "absent"], namespace="w1")[-1] is None
        # raw HTTP: the documented encoding
        status, out = http(url, "v1/state/op/raw?key=1")
        assert status == 200 and out == {"value": {"$bytes": "CgD/"}, "checkpoint_id": first, "flushed_records": 0}
        status, out = http(url, "v1/state/op/pmap?key=%5B3%2C%22x%22%5D")  # the tuple key (3, "x")
        assert status == 200 and out["value"] == {"$map": [[[1, "k"], "13"]]}
        status, out = http(url, "v1/lookup", body=json.dumps({"operator": UID, "state": "count", "keys": [1, [3, "x"]]}).encode())
        assert status == 200 and out["values"] == [10, 13] and out["checkpoint_id"] == first

        second = w.update(2)
        wait_until(lambda: client.position()["checkpoint_id"] == second, 30, "the server at the new checkpoint")
        assert served_view(client) == w.view() and client.get(UID, "count", 1) == 20
    w.job.close()


def test_restore_eager_serves_the_same_state(file_root: RootSpec, tmp_path: Path) -> None:
    """``--restore eager`` loads the whole state before it prints its URL; answers are the same."""
    w = Writer(file_root)
    first = w.update(1)
    with serve(file_root.url, tmp_path, "--restore", "eager") as (url, _):
        client = statelog.query(url, token=TOKEN)
        assert client.position()["checkpoint_id"] == first
        assert served_view(client) == w.view() and served_view(client, "w1") == w.view("w1")
        second = w.update(2)
        wait_until(lambda: client.position()["checkpoint_id"] == second, 30, "the server at the new checkpoint")
        assert served_view(client) == w.view()
    w.job.close()


def test_wrong_or_missing_token_is_refused_and_logged_without_the_token(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    w.update(1)
    with serve(file_root.url, tmp_path) as (url, errors):
        for token in (None, "wrong-token", ""):
            status, out = http(url, "v1/state/op/count?key=1", token=token)
            assert status == 401 and "Authorization: Bearer" in out["error"] and "value" not in out
            assert http(url, "v1/position", token=token)[0] == 401
            status, out = http(url, "v1/lookup", token=token, body=b'{"operator": "op", "state": "count", "keys": [1]}')
            assert status == 401 and "values" not in out
            status, out = http(url, "v1/scan/op/count", token=token)
            assert status == 401 and "entries" not in out
        with pytest.raises(QueryError, match="unauthorized") as e:
            statelog.query(url, token="wrong-token").get(UID, "count", 1)
        assert e.value.status == 401
        assert http(url, "v1/state/op/count?key=1") == (200, {"value": 10, "checkpoint_id": 1, "flushed_records": 0})
        logged = errors.read_text()
        assert "refused GET /v1/state/op/count" in logged and "wrong token" in logged and "no Authorization" in logged
        assert TOKEN not in logged and "wrong-token" not in logged
    w.job.close()


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("v1/state/op/count?key=user-a", None, 400, "not JSON"),
    ("v1/state/op/count", None, 400, "expected one ?key=<JSON>"),
    ("v1/state/op/count?key=%7B%22a%22%3A1%7D", None, 400, "key: expected a JSON string"),
    ("v1/state/op/count?key=1&namespace=%7B%7D", None, 400, "namespace: expected"),
    ("v1/state/nope/count?key=1", None, 404, "no state of operator 'nope'"),
    ("v1/state/op/nope?key=1", None, 404, "has no state 'nope' (its states: blob, count"),
    ("v1/state/op?key=1", None, 400, "expected /v1/state/<operator>/<state>"),
    ("v1/nothing", None, 404, "the endpoints: GET /v1/position"),
    ("v1/position", b"{}", 405, "takes GET"),
    ("v1/lookup", b"{not json", 400, "the body is not JSON"),
    ("v1/lookup", b"[1, 2]", 400, 'expected {"operator"'),
    ("v1/lookup", b'{"operator": "op", "state": "count"}', 400, "missing ['keys']"),
    ("v1/lookup", b'{"operator": "op", "state": "count", "keys": [1, {"x": 2}]}', 400, "keys[1]: expected"),
    ("v1/lookup", b'{"operator": "op", "state": "nope", "keys": [1]}', 404, "has no state 'nope'"),
])  # fmt: skip
def test_bad_requests_get_a_clear_error_and_the_server_stays_up(
    file_root: RootSpec, tmp_path: Path, path: str, body: bytes | None, status: int, message: str
) -> None:
    w = Writer(file_root)
    w.update(1)
    with serve(file_root.url, tmp_path) as (url, _):
        got, out = http(url, path, body=body)
        assert got == status and message in out["error"], out
        assert http(url, "v1/state/op/count?key=1")[1]["value"] == 10  # still serving
    w.job.close()


def test_client_errors_carry_the_servers_message(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    w.update(1)
    with serve(file_root.url, tmp_path, "--operators", UID) as (url, _):
        client = statelog.query(url, token=TOKEN)
        with pytest.raises(QueryError, match="has no state 'nope'") as e:
            client.get(UID, "nope", 1)
        assert e.value.status == 404
        with pytest.raises(QueryError, match="keys\\[0\\]: expected") as e:
            client.get_many(UID, "count", [float("nan")])
        assert e.value.status == 400 and isinstance(e.value, statelog.StatelogError)
        assert client.get(UID, "count", (3, "x")) == 13
    w.job.close()
    with pytest.raises(QueryError, match="cannot reach .*check that statelog serve runs") as e:
        client.position()
    assert e.value.status is None


@pytest.mark.parametrize("how", ["none", "empty file", "missing file"])
def test_no_token_refuses_to_start(file_root: RootSpec, tmp_path: Path, how: str) -> None:
    w = Writer(file_root)
    w.update(1)
    extra = [] if how == "none" else ["--token-file", str(tmp_path / "token")]
    if how == "empty file":
        (tmp_path / "token").write_text("\n")
    env = {k: v for k, v in os.environ.items() if k != "STATELOG_SERVE_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "tools", "serve", file_root.url, "--port", "0", *extra],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "--token-file PATH or the environment variable STATELOG_SERVE_TOKEN" in lines[0], lines
    w.job.close()


def test_token_file(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    w.update(1)
    (tmp_path / "token").write_text("from-a-file\n")
    with serve(file_root.url, tmp_path, "--token-file", str(tmp_path / "token"), token=None) as (url, _):
        assert statelog.query(url, token="from-a-file").get(UID, "count", 2) == 11
        assert http(url, "v1/position")[0] == 401  # the environment's token is not the file's
    w.job.close()


def test_before_the_first_checkpoint_503_then_the_state(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)  # a job root without a completed checkpoint
    with serve(file_root.url, tmp_path, "--json") as (url, _):
        status, out = http(url, "v1/state/op/count?key=1")
        assert status == 503 and "has no completed checkpoint yet" in out["error"]
        assert http(url, "v1/position")[1]["checkpoint_id"] is None
        first = w.update(1)
        client = statelog.query(url, token=TOKEN)
        wait_until(lambda: client.position()["checkpoint_id"] == first, 30, "the server at the first checkpoint")
        assert client.get(UID, "count", 2) == 11
    w.job.close()


def test_scans_by_key_range_and_key_group_page_by_page(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    first = w.update(1)
    w.states["count"].set_namespace(None)
    for k in range(100, 350):  # more int keys: several pages
        w.backend.set_current_key(k)
        w.states["count"].update(k)
    second = w.job.checkpoint().checkpoint_id
    with serve(file_root.url, tmp_path) as (url, _):
        client = statelog.query(url, token=TOKEN)
        wait_until(lambda: client.position()["checkpoint_id"] == second, 30, "the server at the second checkpoint")
        pages = list(client.scan_pages(UID, "count", start=100, end=300, namespace=None, limit=64))
        assert [len(p.value) for p in pages] == [64, 64, 64, 8] and {p.checkpoint_id for p in pages} == {second}
        assert sorted((k, v) for p in pages for k, _, v in p.value) == [(k, k) for k in range(100, 300)]
        status, out = http(url, f"v1/scan/op/count?from=100&to=300&namespace=null&limit=64&cursor={second}:64")
        assert status == 200 and [k for k, _, _ in out["entries"]] == [k for k, _, _ in pages[1].value]  # a cursor used
        # every state kind, both namespaces, in a key group
        groups = {statelog.key_group_of(k, 16) for k in KEYS}
        for d in DESCRIPTORS:
            got = {(k, ns): v for g in groups for k, ns, v in client.scan(UID, d.name, key_group=g) if k in KEYS}
            assert got == {(k, ns): w.view(ns)[(d.name, k)] for k in KEYS for ns in (None, "w1")}, d.name
        g = statelog.key_group_of(1, 16)
        assert all(statelog.key_group_of(k, 16) == g for k, _, _ in client.scan(UID, "count", key_group=g))
        assert {k for k, _, _ in client.scan(UID, "count", start="a", end="v")} == {"user-a"}  # str keys only
        # raw HTTP: the documented shape, the cursor, and a cursor of another checkpoint
        status, out = http(url, "v1/scan/op/count?from=100&to=103&namespace=null&limit=2")
        assert status == 200 and out["next"] == f"{second}:2" and out["checkpoint_id"] == second
        assert len(out["entries"]) == 2 and all(e in [[k, None, k] for k in (100, 101, 102)] for e in out["entries"])
        status, out = http(url, f"v1/scan/op/count?from=100&to=103&namespace=null&limit=2&cursor={first}:2")
        assert status == 409 and "start the scan again" in out["error"]
    w.job.close()


@pytest.mark.parametrize(("path", "status", "message"), [
    ("v1/scan/op/count?limit=0", 400, "limit: expected an integer 1..10000"),
    ("v1/scan/op/count?limit=x", 400, "limit: expected"),
    ("v1/scan/op/count?from=user-a", 400, "from: expected"),
    ("v1/scan/op/count?key_group=16", 400, "key_group: expected 0..15"),
    ("v1/scan/op/count?cursor=zz", 400, "cursor: expected"),
    ("v1/scan/op/count?bogus=1", 400, "unknown ['bogus']"),
    ("v1/scan/op/nope", 404, "has no state 'nope'"),
    ("v1/scan/nope/count", 404, "no state of operator 'nope'"),
    ("v1/scan/op", 400, "expected /v1/scan/<operator>/<state>"),
])  # fmt: skip
def test_bad_scans_get_a_clear_error_and_the_server_stays_up(
    file_root: RootSpec, tmp_path: Path, path: str, status: int, message: str
) -> None:
    w = Writer(file_root)
    w.update(1)
    with serve(file_root.url, tmp_path) as (url, _):
        got, out = http(url, path)
        assert got == status and message in out["error"], out
        assert http(url, "v1/scan/op/count?limit=1")[0] == 200  # still serving
    w.job.close()


def test_sql_over_the_replica_with_the_views_of_statelog_sql(file_root: RootSpec, tmp_path: Path) -> None:
    w = Writer(file_root)
    first = w.update(1)
    with serve(file_root.url, tmp_path) as (url, _):
        client = statelog.query(url, token=TOKEN)
        out = client.sql("SELECT count(*) AS n, sum(value) AS s FROM op__count WHERE namespace IS NULL")
        assert out["columns"] == ["n", "s"] and out["rows"] == [[4, 10 + 11 + 12 + 13]]
        assert out["checkpoint_id"] == first and out["truncated"] is False
        out = client.sql("WITH c AS (SELECT key, value FROM op__count WHERE namespace = 'w1') "
                         "SELECT c.key, c.value, r.value AS raw FROM c JOIN op__raw r USING (key) "
                         "WHERE r.namespace = 'w1' ORDER BY c.value")  # fmt: skip
        assert [r[1] for r in out["rows"]] == [10, 11, 12, 13] and out["rows"][0][2] == bytes([10, 0, 255])
        assert client.sql("SELECT value FROM op__count ORDER BY value", max_rows=3)["truncated"] is True
        second = w.update(2)
        wait_until(lambda: client.position()["checkpoint_id"] == second, 30, "the server at the new checkpoint")
        out = client.sql("SELECT max(value) FROM op__count")
        assert out["rows"] == [[23]] and out["checkpoint_id"] == second  # the replica moved: the view too
    w.job.close()


@pytest.mark.parametrize(("body", "message"), [
    (b'{"query": "DELETE FROM op__count"}', "read-only queries"),
    (b'{"query": "SELECT 1; SELECT 2"}', "one statement"),
    (b'{"query": "SELECT * FROM nope__x"}', "no view 'nope__x'"),
    (b'{"query": "SELEC 1"}', "read-only queries"),
    (b'{"query": "SELECT nosuchcolumn FROM op__count"}', "nosuchcolumn"),
    (b'{"query": "SELECT read_text(\'/etc/passwd\')"}', ""),
    (b'{"sql": "SELECT 1"}', 'expected {"query"'),
    (b'{"query": "SELECT 1", "max_rows": 0}', "max_rows"),
])  # fmt: skip
def test_bad_sql_gets_a_clear_error_and_the_server_stays_up(
    file_root: RootSpec, tmp_path: Path, body: bytes, message: str
) -> None:
    w = Writer(file_root)
    w.update(1)
    with serve(file_root.url, tmp_path) as (url, _):
        got, out = http(url, "v1/sql", body=body)
        assert got == 400 and message in out["error"], out
        assert http(url, "v1/sql", body=b'{"query": "SELECT count(*) FROM op__count"}')[1]["rows"] == [[8]]
    w.job.close()
