"""The Arrow Flight server of ``statelog serve --flight-port N``: the HTTP server's lookups,
scans and SQL as Arrow tables, read-only, behind the same token, over the same follower.

Every call must bring the header ``authorization: Bearer TOKEN`` (else
``FlightUnauthenticatedError``, logged in one line without the token). ``do_get`` takes a
ticket holding a JSON object (keys, namespaces and bounds as
:mod:`statelog.following.json_values` encodes them):

* ``{"lookup": {"operator", "state", "keys": [...], "namespace"?}}`` (at most
  :data:`MAX_LOOKUP_KEYS` keys): columns ``key``, ``namespace``, ``value`` (null when the
  follower's ``get`` is None) and ``found``, a row per key in the ticket's order;
* ``{"scan": {"operator", "state", "from"?, "to"?, "key_group"?, "namespace"?, "limit"?, "cursor"?}}``
  (the arguments of the HTTP scan, :mod:`tools.serve.scan`): a page of entries, columns ``key``,
  ``namespace``, ``value``; the schema's metadata ``next`` is the next page's cursor;
* ``{"sql": {"query", "max_rows"?}}``: DuckDB's result as it is (:mod:`tools.serve.sql`); the
  metadata ``truncated`` says whether rows were left off.

The ``key``, ``namespace`` and ``value`` columns are typed as
:mod:`statelog.following.arrow_values` says (a plain Arrow type or JSON text; the metadata
``encoding`` names which). Every answer's schema metadata holds ``checkpoint_id`` and
``flushed_records`` (JSON text).
``list_flights`` (criteria: empty, or an operator uid) and ``get_flight_info`` (a path
descriptor ``[operator, state]``) describe each followed state, with the ticket of its first
scan page; ``do_action("position")`` returns the follower's position as JSON.

A refused request is a ``FlightServerError`` whose message starts with ``bad request:``,
``not found:``, ``conflict:`` or ``unavailable:`` and says what to do; its ``extra_info`` is
the HTTP status the HTTP server would answer (``b"400"``, ``b"404"``, ``b"409"``, ``b"503"``).
The server goes on serving. Requests are counted in the HTTP server's metrics
(:class:`tools.serve.metrics.ServeMetrics`: ``batch``, ``scan``, ``sql``, ``other``).
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.flight as fl

from statelog.errors import ConfigError, SerializationError, StatelogError, StateNotFoundError
from statelog.following.arrow_values import arrow_column
from statelog.following.follower import Follower
from statelog.following.json_values import KEY_EXPECTED, from_json, key_from_json
from tools.serve.metrics import ServeMetrics
from tools.serve.scan import ScanCursors, ScanError, scan_page
from tools.serve.server import MAX_SQL_ROWS, RequestError, position_json
from tools.serve.sql import DEFAULT_MAX_ROWS, ReplicaSQL, SQLError

__all__ = ["MAX_LOOKUP_KEYS", "SCAN_SCHEMA", "FlightStateServer", "start_flight"]

log = logging.getLogger("tools.serve")

MAX_LOOKUP_KEYS = 100_000
TICKETS = ('{"lookup": {"operator", "state", "keys": [...], "namespace"?}}, '
           '{"scan": {"operator", "state", "from"?, "to"?, "key_group"?, "namespace"?, "limit"?, "cursor"?}} '
           'or {"sql": {"query", "max_rows"?}}')  # fmt: skip
SCAN_SCHEMA = pa.schema([("key", pa.string()), ("namespace", pa.string()), ("value", pa.string())])  # (get_flight_info: as JSON text)
_PLAIN_KEYS = {int, str, float, bool, type(None)}  # keys JSON gives as themselves
_KINDS = {"lookup": "batch", "scan": "scan", "sql": "sql"}  # ticket kind -> metrics kind
_LABELS = {HTTPStatus.BAD_REQUEST: "bad request", HTTPStatus.NOT_FOUND: "not found", HTTPStatus.CONFLICT: "conflict",
           HTTPStatus.SERVICE_UNAVAILABLE: "unavailable"}  # fmt: skip


class _TokenCheck(fl.ServerMiddlewareFactory):
    """Refuses a call without ``authorization: Bearer <token>`` (logged and counted, without the token)."""

    def __init__(self, token: bytes, metrics: ServeMetrics) -> None:
        self.token = token
        self.metrics = metrics

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[Any]]) -> None:
        given = (headers.get("authorization") or [""])[0]
        if isinstance(given, bytes):
            given = given.decode("utf-8", "replace")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.token):
            return
        why = "no authorization header" if not given else "not a bearer token" if scheme.lower() != "bearer" else "wrong token"
        log.warning("statelog serve: refused Flight %s: %s", info.method.name, why)
        self.metrics.observe("other", "refused", 0.0)
        raise fl.FlightUnauthenticatedError(
            f"unauthorized ({why}): send the server's token as the header 'authorization: Bearer <token>'")


def _refusal(status: HTTPStatus, message: str) -> fl.FlightServerError:
    return fl.FlightServerError(f"{_LABELS.get(status, 'bad request')}: {message}", extra_info=str(int(status)).encode())


def _meta(table: pa.Table, **meta: Any) -> pa.Table:
    return table.replace_schema_metadata({k: json.dumps(v) for k, v in meta.items()})


def _entries(key: list[Any], namespace: list[Any], value: list[Any] | pa.Array,
             **more: pa.Array) -> tuple[pa.Table, dict[str, str]]:  # fmt: skip
    column = (value, "arrow") if isinstance(value, pa.Array) else arrow_column(value)
    cols = {"key": arrow_column(key), "namespace": arrow_column(namespace), "value": column}
    table = pa.table({**{n: c[0] for n, c in cols.items()}, **more})
    return table, {n: c[1] for n, c in cols.items()}


def _fields(body: Any, required: tuple[str, ...], optional: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, f"a {what} ticket holds a JSON object, got {json.dumps(body)[:120]}")
    missing = [f for f in required if f not in body]
    unknown = sorted(set(body) - set(required) - set(optional))
    if missing or unknown:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"a {what} ticket takes {', '.join(required)} and optionally "
                           f"{', '.join(optional)}; missing {missing}, unknown {unknown}")
    for f in ("operator", "state"):
        if f in required and not isinstance(body[f], str):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{what}: {f} is a string, got {json.dumps(body[f])[:80]}")
    return body


class FlightStateServer(fl.FlightServerBase):
    """Flight over a follower's replica (see the module's doc); ``shutdown()`` stops it."""

    def __init__(self, location: str, follower: Follower, token: str, sql: ReplicaSQL, scans: ScanCursors,
                 metrics: ServeMetrics) -> None:
        super().__init__(location, middleware={"token": _TokenCheck(token.encode(), metrics)})
        self.follower = follower
        self.sql = sql
        self.scans = scans
        self.metrics = metrics

    # -- calls ---------------------------------------------------------------------------------

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.RecordBatchStream:
        kind = "other"

        def answer() -> pa.Table:
            nonlocal kind
            request = self._ticket(ticket.ticket)
            ((what, body),) = request.items()
            kind = _KINDS[what]
            return {"lookup": self._lookup, "scan": self._scan, "sql": self._sql}[what](body)

        return fl.RecordBatchStream(self._call(answer, lambda: kind))

    def list_flights(self, context: fl.ServerCallContext, criteria: bytes) -> Iterator[fl.FlightInfo]:
        only = criteria.decode("utf-8", "replace") if criteria else None
        infos = self._call(lambda: [self._info(uid, state) for uid, state in self._states() if only in (None, uid)])
        yield from infos

    def get_flight_info(self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        def info() -> fl.FlightInfo:
            path = [p.decode("utf-8", "replace") for p in (descriptor.path or [])]
            if descriptor.descriptor_type != fl.DescriptorType.PATH or len(path) != 2:
                raise RequestError(HTTPStatus.BAD_REQUEST, "expected a path descriptor [operator, state] "
                                   "(FlightDescriptor.for_path(operator, state)); list_flights lists them")
            if (path[0], path[1]) not in self._states():
                self.follower.read(path[0], path[1], 0)  # raises the lookups' error (which operators/states there are)
                raise RequestError(HTTPStatus.NOT_FOUND, f"operator {path[0]!r} has no state {path[1]!r}; list_flights lists them")
            return self._info(path[0], path[1])

        return self._call(info)

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        def run() -> bytes:
            if action.type != "position":
                raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown action {action.type!r}: the actions are ['position']")
            return json.dumps(position_json(self.follower)).encode()

        yield self._call(run)

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return [("position", "the follower's position and the operators it follows (JSON)")]

    # -- answers -------------------------------------------------------------------------------

    def _call(self, fn: Any, kind: Any = lambda: "other") -> Any:
        start = time.perf_counter()
        outcome = "ok"
        try:
            return fn()
        except (RequestError, ScanError, SQLError) as e:
            outcome = "client_error" if e.status < 500 else "server_error"
            raise _refusal(e.status, str(e)) from None
        except StateNotFoundError as e:
            outcome = "client_error"
            raise _refusal(HTTPStatus.NOT_FOUND, str(e)) from None
        except (ConfigError, SerializationError) as e:
            outcome = "client_error"
            raise _refusal(HTTPStatus.BAD_REQUEST, str(e)) from None
        except StatelogError as e:
            outcome = "server_error"
            raise _refusal(HTTPStatus.SERVICE_UNAVAILABLE, str(e)) from None
        except Exception as e:
            outcome = "server_error"
            log.exception("statelog serve: a Flight call failed")
            raise fl.FlightInternalError(f"internal error: {type(e).__name__}: {e}") from None
        finally:
            self.metrics.observe(kind(), outcome, time.perf_counter() - start)

    def _ticket(self, raw: bytes) -> dict[str, Any]:
        try:
            request = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the ticket is not JSON: expected {TICKETS}, got {raw[:80]!r}") from None
        if not isinstance(request, dict) or len(request) != 1 or next(iter(request)) not in _KINDS:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"expected a ticket {TICKETS}, got {json.dumps(request)[:120]}")
        return request

    def _lookup(self, body: Any) -> pa.Table:
        b = _fields(body, ("operator", "state", "keys"), ("namespace",), "lookup")
        keys = b["keys"]
        if not isinstance(keys, list):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"lookup: keys is a list of keys ({KEY_EXPECTED}), got {json.dumps(keys)[:80]}")
        if len(keys) > MAX_LOOKUP_KEYS:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"a lookup takes at most {MAX_LOOKUP_KEYS} keys, got {len(keys)}: split the batch")
        if set(map(type, keys)) <= _PLAIN_KEYS:
            decoded = keys
        else:
            decoded = [key_from_json(k, f"keys[{i}]") for i, k in enumerate(keys)]
        namespace = key_from_json(b.get("namespace"), "namespace")
        read = self.follower.read_column(b["operator"], b["state"], decoded, namespace)
        if isinstance(read.value, pa.Array):  # a value state read a column at a time: sent as it is
            found = read.value.is_valid()
        else:
            found = pa.array([v is not None for v in read.value], pa.bool_())
        table, encoding = _entries(decoded, [namespace] * len(keys), read.value, found=found)
        return _meta(table, encoding=encoding, checkpoint_id=read.checkpoint_id, flushed_records=read.flushed_records)

    def _scan(self, body: Any) -> pa.Table:
        b = _fields(body, ("operator", "state"), ("from", "to", "key_group", "namespace", "limit", "cursor"), "scan")
        args = {k: str(v) if k in ("key_group", "limit", "cursor") else json.dumps(v)
                for k, v in b.items() if k not in ("operator", "state")}  # fmt: skip
        out = scan_page(self.follower, b["operator"], b["state"], urlencode(args), self.scans)
        entries = out["entries"]
        table, encoding = _entries([key_from_json(e[0]) for e in entries], [key_from_json(e[1]) for e in entries],
                                   [from_json(e[2]) for e in entries])  # fmt: skip
        return _meta(table, encoding=encoding, next=out["next"], checkpoint_id=out["checkpoint_id"],
                     flushed_records=out["flushed_records"])  # fmt: skip

    def _sql(self, body: Any) -> pa.Table:
        b = _fields(body, ("query",), ("max_rows",), "sql")
        max_rows = b.get("max_rows", DEFAULT_MAX_ROWS)
        if not isinstance(b["query"], str) or not isinstance(max_rows, int) or isinstance(max_rows, bool) \
                or not 1 <= max_rows <= MAX_SQL_ROWS:
            raise RequestError(HTTPStatus.BAD_REQUEST, f'sql: expected {{"query": "SELECT ...", "max_rows": '
                               f'1..{MAX_SQL_ROWS}}}, got {json.dumps(body)[:120]}')
        result = self.sql.run(b["query"], max_rows)
        return _meta(result.table, truncated=result.truncated, checkpoint_id=result.checkpoint_id,
                     flushed_records=result.flushed_records)  # fmt: skip

    def _states(self) -> list[tuple[str, str]]:
        def states(meta: Any, replicas: dict[str, Any], ahead: int) -> list[tuple[str, str]]:
            if meta is None:
                raise StatelogError(f"{self.follower.root} has no completed checkpoint yet: there is no state to list")
            return [(uid, s) for uid in sorted(replicas) for s in sorted(meta.operators[uid].states)
                    if not s.startswith("__timers")]  # fmt: skip

        return list(self.follower.with_replicas(states))

    def _info(self, operator: str, state: str) -> fl.FlightInfo:
        ticket = fl.Ticket(json.dumps({"scan": {"operator": operator, "state": state}}).encode())
        return fl.FlightInfo(SCAN_SCHEMA, fl.FlightDescriptor.for_path(operator, state), [fl.FlightEndpoint(ticket, [])], -1, -1)


def start_flight(follower: Follower, host: str, port: int, token: str, sql: ReplicaSQL, scans: ScanCursors,
                 metrics: ServeMetrics) -> FlightStateServer:
    """A Flight server on ``host:port`` (0: any free port, see ``server.port``) serving in a
    daemon thread; ``shutdown()`` stops it. Raises ``OSError``/``pyarrow.ArrowException`` when
    it cannot bind."""
    if not token:
        raise ConfigError("statelog serve needs a token; refusing to serve without one")
    if port:  # gRPC reports a taken port on stderr and as "Server did not start properly": ask the OS first
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    server = FlightStateServer(f"grpc://{host}:{port}", follower, token, sql, scans, metrics)
    threading.Thread(target=server.serve, name="statelog-flight", daemon=True).start()
    return server
