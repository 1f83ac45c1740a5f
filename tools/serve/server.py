"""The HTTP/JSON server of ``statelog serve``: point lookups in a follower's replica, read-only.

Endpoints (docs/follow.md, "Serving it"), every one behind ``Authorization: Bearer TOKEN``:

* ``GET /v1/position``: the follower's position and the operators it follows;
* ``GET /v1/state/<operator>/<state>?key=<JSON>[&namespace=<JSON>]``: one value, with the
  checkpoint it was read at (``{"value", "checkpoint_id", "flushed_records"}``);
* ``POST /v1/lookup`` with ``{"operator", "state", "keys": [...], "namespace"?}``: the values
  of a batch of keys, all read from the same state (``{"values", "checkpoint_id",
  "flushed_records"}``);
* ``GET /v1/scan/<operator>/<state>?[from=..&to=..][&key_group=N][&namespace=..][&limit=N][&cursor=C]``:
  a page of the state's entries by key range or key group (:mod:`tools.serve.scan`);
* ``POST /v1/sql`` with ``{"query": "SELECT ...", "max_rows"?: N}``: a read-only query over the
  replica's views (:mod:`tools.serve.sql`): ``{"columns", "rows", "truncated", "checkpoint_id",
  "flushed_records"}``.

Values and keys are JSON as :mod:`statelog.following.json_values` encodes them. Every error
is a JSON object ``{"error": message}`` with its status: 401 (a missing or wrong token, logged
without the token), 400 (malformed path, key or body), 404 (unknown endpoint, operator or
state), 405, 409 (a scan's cursor from another checkpoint), 413 (body too large), 503 (nothing to read yet, or the store fails). The server
runs a thread per connection (:class:`http.server.ThreadingHTTPServer`, HTTP/1.1 keep-alive);
the follower's lock keeps each answer to one state.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from statelog.errors import ConfigError, SerializationError, StatelogError, StateNotFoundError
from statelog.following.follower import Follower
from statelog.following.json_values import KEY_EXPECTED, key_from_json, to_json
from tools.serve.metrics import ServeMetrics
from tools.serve.scan import ScanCursors, ScanError, scan_page
from tools.serve.sql import DEFAULT_MAX_ROWS, ReplicaSQL, SQLError, json_rows

__all__ = ["MAX_BODY_BYTES", "make_server"]

log = logging.getLogger("tools.serve")

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_SQL_ROWS = 100_000
ENDPOINTS = ("GET /v1/position, GET /v1/state/<operator>/<state>?key=<JSON>[&namespace=<JSON>], POST /v1/lookup, "
             "GET /v1/scan/<operator>/<state>, POST /v1/sql")


class RequestError(StatelogError):
    """A request the server answers with ``status`` and ``{"error": message}``."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json_arg(text: str, what: str) -> Any:
    try:
        return key_from_json(json.loads(text), what)
    except json.JSONDecodeError:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"{what}: expected {KEY_EXPECTED}, URL-encoded (a string in quotes: {what}=%22user-42%22); "
            f"got {text[:80]!r}, which is not JSON",
        ) from None


def position_json(follower: Follower) -> dict[str, Any]:
    p = follower.position
    return {
        "checkpoint_id": p.checkpoint_id, "consistency": p.consistency.value, "exact": p.exact,
        "flushed_records": p.flushed_records, "lag_s": p.lag_s, "data_lag_s": p.data_lag_s,
        "lag_checkpoints": p.lag_checkpoints, "restores": p.restores, "operators": follower.operators(),
    }  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    """One request: the token, then the endpoint; every answer is JSON."""

    server: StateServer
    server_version = "statelog-serve"
    protocol_version = "HTTP/1.1"  # keep-alive: a client's lookups reuse its connection
    disable_nagle_algorithm = True  # (headers and body are two writes: no wait for the delayed ACK)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: HTTPStatus, body: Any) -> None:
        data = json.dumps(body, allow_nan=False).encode()
        self._status = status
        if status != HTTPStatus.OK:
            self.close_connection = True  # (a refused request's body may be unread)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Bearer realm="statelog"')
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.server.token)
        if not ok:
            why = "no Authorization header" if not given else "not a bearer token" if scheme.lower() != "bearer" else "wrong token"
            log.warning("statelog serve: refused %s %s from %s: %s", self.command, urlsplit(self.path).path,
                        self.client_address[0], why)  # fmt: skip
            self._send(HTTPStatus.UNAUTHORIZED, {
                "error": f"unauthorized ({why}): send the server's token as 'Authorization: Bearer <token>'"})
        return ok

    def _kind(self) -> str:
        parts = urlsplit(self.path).path.strip("/").split("/")[:2]
        return {"state": "lookup", "lookup": "batch", "scan": "scan", "sql": "sql"}.get(parts[1] if len(parts) == 2 else "", "other")

    def _handle(self, method: str) -> None:
        start = time.perf_counter()
        self._status = HTTPStatus.OK
        try:
            self._answer(method)
        finally:
            s = self._status
            outcome = ("ok" if s == HTTPStatus.OK else "refused" if s == HTTPStatus.UNAUTHORIZED
                       else "client_error" if s < 500 else "server_error")  # fmt: skip
            self.server.metrics.observe(self._kind(), outcome, time.perf_counter() - start)

    def _answer(self, method: str) -> None:
        if not self._authorized():
            return
        try:
            self._send(HTTPStatus.OK, self._route(method))
        except (RequestError, ScanError, SQLError) as e:
            self._send(e.status, {"error": str(e)})
        except StateNotFoundError as e:
            self._send(HTTPStatus.NOT_FOUND, {"error": str(e)})
        except (ConfigError, SerializationError) as e:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except StatelogError as e:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(e)})
        except Exception as e:
            log.exception("statelog serve: %s %s failed", method, urlsplit(self.path).path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(e).__name__}: {e}"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _route(self, method: str) -> Any:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["v1", "position"]:
            self._method(method, "GET")
            return position_json(self.server.follower)
        if parts[:2] == ["v1", "state"]:
            self._method(method, "GET")
            if len(parts) != 4 or not all(parts[2:]):
                raise RequestError(HTTPStatus.BAD_REQUEST,
                                   f"expected /v1/state/<operator>/<state>?key=<JSON>, got {url.path!r}")
            return self._state(parts[2], parts[3], url.query)
        if parts[:2] == ["v1", "scan"]:
            self._method(method, "GET")
            if len(parts) != 4 or not all(parts[2:]):
                raise RequestError(HTTPStatus.BAD_REQUEST, f"expected /v1/scan/<operator>/<state>, got {url.path!r}")
            return scan_page(self.server.follower, parts[2], parts[3], url.query, self.server.scans)
        if parts == ["v1", "sql"]:
            self._method(method, "POST")
            return self._sql(self._body())
        if parts == ["v1", "lookup"]:
            self._method(method, "POST")
            return self._lookup(self._body())
        raise RequestError(HTTPStatus.NOT_FOUND, f"no endpoint {method} {url.path!r}; the endpoints: {ENDPOINTS}")

    def _method(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{urlsplit(self.path).path} takes {allowed}, got {method}")

    def _state(self, operator: str, state: str, query: str) -> Any:
        args = parse_qs(query, keep_blank_values=True)
        unknown = sorted(set(args) - {"key", "namespace"})
        if unknown or len(args.get("key", [])) != 1 or len(args.get("namespace", [None])) != 1:
            raise RequestError(
                HTTPStatus.BAD_REQUEST,
                "expected one ?key=<JSON> and at most one &namespace=<JSON> (JSON, URL-encoded: "
                f"?key=%22user-42%22 for the string key user-42), got {('?' + query) if query else 'no query'}",
            )
        key = _json_arg(args["key"][0], "key")
        namespace = _json_arg(args["namespace"][0], "namespace") if "namespace" in args else None
        read = self.server.follower.read(operator, state, key, namespace)
        return {"value": to_json(read.value), "checkpoint_id": read.checkpoint_id, "flushed_records": read.flushed_records}

    def _body(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError(HTTPStatus.BAD_REQUEST, f"POST {urlsplit(self.path).path} expects a JSON body with a Content-Length")
        if int(length) > MAX_BODY_BYTES:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"the body has {length} bytes, at most {MAX_BODY_BYTES} are read: send fewer keys per lookup")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not JSON ({e}); expected "
                               '{"operator": ..., "state": ..., "keys": [...], "namespace": ...}') from None

    def _sql(self, body: Any) -> Any:
        expected = f'expected {{"query": "SELECT ...", "max_rows": <1..{MAX_SQL_ROWS}, default {DEFAULT_MAX_ROWS}>}}'
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or set(body) - {"query", "max_rows"}:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{expected}, got {json.dumps(body)[:120]}")
        max_rows = body.get("max_rows", DEFAULT_MAX_ROWS)
        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or not 1 <= max_rows <= MAX_SQL_ROWS:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"max_rows: {expected}, got {max_rows!r}")
        return json_rows(self.server.sql.run(body["query"], max_rows))

    def _lookup(self, body: Any) -> Any:
        expected = 'expected {"operator": "<uid>", "state": "<name>", "keys": [<JSON key>, ...], "namespace": <JSON>}'
        if not isinstance(body, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{expected}, got a JSON {type(body).__name__}")
        unknown = sorted(set(body) - {"operator", "state", "keys", "namespace"})
        missing = [f for f in ("operator", "state", "keys") if f not in body]
        if unknown or missing:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{expected}; missing {missing}, unknown {unknown}")
        operator, state, keys = body["operator"], body["state"], body["keys"]
        if not isinstance(operator, str) or not isinstance(state, str) or not isinstance(keys, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{expected}: operator and state strings, keys a list")
        decoded = [key_from_json(k, f"keys[{i}]") for i, k in enumerate(keys)]
        namespace = key_from_json(body.get("namespace"), "namespace")
        read = self.server.follower.read_many(operator, state, decoded, namespace)
        return {"values": [to_json(v) for v in read.value], "checkpoint_id": read.checkpoint_id,
                "flushed_records": read.flushed_records}  # fmt: skip


class StateServer(ThreadingHTTPServer):
    """The server: a follower to read and the token every request must bring."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], follower: Follower, token: str) -> None:
        self.follower = follower
        self.token = token.encode()
        self.sql = ReplicaSQL(follower)
        self.sql.prepare()
        self.scans = ScanCursors()
        self.metrics = ServeMetrics(follower)
        super().__init__(address, Handler)


def make_server(follower: Follower, host: str, port: int, token: str) -> StateServer:
    """A bound server (``port`` 0: any free port, see ``server.server_address``); call
    ``serve_forever()``. Raises ``OSError`` when it cannot bind."""
    if not token:
        raise ConfigError("statelog serve needs a token; refusing to serve without one")
    return StateServer((host, port), follower, token)
