"""The Arrow Flight client of ``statelog serve --flight-port``: :func:`statelog.query` returns a
:class:`FlightQueryClient` for a ``grpc://HOST:PORT`` URL (the server: :mod:`tools.serve.flight`).

It has the methods of the HTTP client (:class:`statelog.query_client.QueryClient`: ``get``,
``get_many``, ``read``, ``read_many``, ``scan``, ``scan_pages``, ``position``) with the same
values, and answers as Arrow tables where a program wants them: :meth:`FlightQueryClient.lookup`
(``key``, ``namespace``, ``value``, ``found``), :meth:`FlightQueryClient.scan_table` and
:meth:`FlightQueryClient.sql` (DuckDB's result). The token travels as the header
``authorization: Bearer TOKEN`` on every call; a refused or failed call raises
:class:`~statelog.errors.QueryError` with the server's message and the HTTP status the HTTP
server would answer; the token never appears in a message. Importing this module imports
``pyarrow.flight`` (``statelog.query`` imports it only for a ``grpc://`` URL).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from statelog.errors import ConfigError, QueryError
from statelog.following.arrow_values import arrow_column, python_values
from statelog.following.json_values import to_json
from statelog.following.position import Read

__all__ = ["FLIGHT_SCHEMES", "FlightQueryClient"]

FLIGHT_SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")
_ALL = object()  # a scan of every namespace
_PLAIN_KEYS = {int, str, bool, type(None)}
_STATUS = {"bad request": 400, "not found": 404, "conflict": 409, "unavailable": 503}


def _message(e: fl.FlightError) -> str:
    return str(e).split(". Detail:")[0].split(". gRPC client debug context:")[0]


def _read(table: pa.Table, value: Any) -> Read:
    meta = table.schema.metadata or {}
    return Read(value, json.loads(meta.get(b"checkpoint_id", b"null")), json.loads(meta.get(b"flushed_records", b"0")))


class FlightQueryClient:
    """Lookups, scans and SQL in the state a ``statelog serve`` server follows, over Arrow Flight."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        if not url.startswith(FLIGHT_SCHEMES):
            raise ConfigError(f"statelog.query: expected the server's Flight URL grpc://HOST:PORT, got {url!r}")
        if not token:
            raise ConfigError("statelog.query: expected the server's token (token=...), got none")
        self.url = url.rstrip("/")
        self._client = fl.FlightClient(self.url)
        self._options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())], timeout=timeout)

    def __repr__(self) -> str:
        return f"FlightQueryClient({self.url!r})"

    def close(self) -> None:
        """Close the connection (the client is unusable afterwards)."""
        self._client.close()

    def __enter__(self) -> FlightQueryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except fl.FlightUnauthenticatedError as e:
            raise QueryError(f"{self.url}: {_message(e)}", status=401) from None
        except fl.FlightServerError as e:
            extra = getattr(e, "extra_info", b"") or b""
            message = _message(e)
            status = int(extra) if extra.isdigit() else _STATUS.get(message.partition(":")[0])
            raise QueryError(f"{self.url}: {message}", status=status) from None
        except fl.FlightUnavailableError as e:
            raise QueryError(f"cannot reach {self.url}: {_message(e)}; check that statelog serve --flight-port "
                             "runs there") from None  # fmt: skip
        except fl.FlightError as e:
            raise QueryError(f"{self.url}: {_message(e)}") from None

    def _get(self, kind: str, body: dict[str, Any]) -> pa.Table:
        ticket = fl.Ticket(json.dumps({kind: body}, allow_nan=False).encode())
        return self._call(lambda: self._client.do_get(ticket, self._options).read_all())

    # -- the HTTP client's methods -------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        """The server's follower position: ``checkpoint_id``, ``consistency``, ``exact``,
        ``flushed_records``, ``lag_s``, ``data_lag_s``, ``lag_checkpoints``, ``restores`` and
        the ``operators`` it follows."""
        results = self._call(lambda: list(self._client.do_action(fl.Action("position", b""), self._options)))
        return dict(json.loads(results[0].body.to_pybytes()))

    def read(self, operator: str, state: str, key: Any, namespace: Any = None) -> Read:
        """The value at ``key`` (and ``namespace``) with the checkpoint it was read at."""
        r = self.read_many(operator, state, [key], namespace)
        return Read(r.value[0], r.checkpoint_id, r.flushed_records)

    def get(self, operator: str, state: str, key: Any, namespace: Any = None) -> Any:
        """The value of ``state`` of ``operator`` at ``key`` (and ``namespace``)."""
        return self.read(operator, state, key, namespace).value

    def read_many(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> Read:
        """The values at each of ``keys``, read from the same state (``Read.value``: the list)."""
        table = self.lookup(operator, state, keys, namespace)
        return _read(table, python_values(table, "value"))

    def get_many(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> list[Any]:
        """The values at each of ``keys`` (one call), in their order."""
        return list(self.read_many(operator, state, keys, namespace).value)

    def scan_pages(self, operator: str, state: str, *, start: Any = None, end: Any = None, key_group: int | None = None,
                   namespace: Any = _ALL, limit: int = 1000) -> Iterator[Read]:
        """The entries of ``state`` of ``operator`` page by page (``limit`` entries a call): keys
        ``start <= key < end`` (each bound optional), of ``key_group``, in ``namespace``
        (default: every namespace). Each :class:`Read` holds a list of ``(key, namespace,
        value)``; the pages are all of one checkpoint (``QueryError`` with status 409 when the
        server moved on during the scan: scan again)."""
        for table in self._scan_tables(operator, state, start, end, key_group, namespace, limit):
            yield _read(table, list(zip(*(python_values(table, c) for c in ("key", "namespace", "value")), strict=True)))

    def scan(self, operator: str, state: str, **kwargs: Any) -> Iterator[tuple[Any, Any, Any]]:
        """``(key, namespace, value)`` of the entries :meth:`scan_pages` returns, one by one."""
        for page in self.scan_pages(operator, state, **kwargs):
            yield from page.value

    # -- Arrow answers ---------------------------------------------------------------------------

    def lookup(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> pa.Table:
        """The values at each of ``keys`` as one Arrow table, a row per key in their order:
        ``key``, ``namespace``, ``value`` (null when absent) and ``found``. A column is of a
        plain Arrow type when all its values are of one plain type (int, float, str, bool,
        bytes), else JSON text; the schema's metadata ``encoding`` says which per column
        (:func:`statelog.following.arrow_values.python_values` decodes either) and holds ``checkpoint_id`` and ``flushed_records``
        (JSON text)."""
        keys = list(keys)
        plain = set(map(type, keys)) <= _PLAIN_KEYS  # (JSON gives them as themselves)
        body: dict[str, Any] = {"operator": operator, "state": state, "keys": keys if plain else [to_json(k) for k in keys]}
        if namespace is not None:
            body["namespace"] = to_json(namespace)
        return self._get("lookup", body)

    def _scan_tables(self, operator: str, state: str, start: Any, end: Any, key_group: int | None, namespace: Any,
                     limit: int) -> Iterator[pa.Table]:
        body: dict[str, Any] = {"operator": operator, "state": state, "limit": limit}
        if start is not None:
            body["from"] = to_json(start)
        if end is not None:
            body["to"] = to_json(end)
        if key_group is not None:
            body["key_group"] = key_group
        if namespace is not _ALL:
            body["namespace"] = to_json(namespace)
        while True:
            table = self._get("scan", body)
            yield table
            cursor = json.loads((table.schema.metadata or {}).get(b"next", b"null"))
            if cursor is None:
                return
            body["cursor"] = cursor

    def scan_table(self, operator: str, state: str, *, start: Any = None, end: Any = None, key_group: int | None = None,
                   namespace: Any = _ALL, limit: int = 10_000) -> pa.Table:
        """Every entry :meth:`scan_pages` returns as one Arrow table (``key``, ``namespace``,
        ``value``, typed as :meth:`lookup` says), fetched ``limit`` entries a call, all of one
        checkpoint."""
        rows: list[tuple[Any, Any, Any]] = []
        meta: dict[bytes, bytes] = {}
        for page in self._scan_tables(operator, state, start, end, key_group, namespace, limit):
            rows.extend(zip(*(python_values(page, c) for c in ("key", "namespace", "value")), strict=True))
            meta = {k: v for k, v in (page.schema.metadata or {}).items() if k != b"next"}
        cols = {n: arrow_column([r[i] for r in rows]) for i, n in enumerate(("key", "namespace", "value"))}
        meta[b"encoding"] = json.dumps({n: c[1] for n, c in cols.items()}).encode()
        return pa.table({n: c[0] for n, c in cols.items()}).replace_schema_metadata(meta)

    def sql(self, query: str, max_rows: int = 10_000) -> pa.Table:
        """A read-only query (one ``SELECT`` or ``WITH``) over the replica's views
        ``<operator>__<state>``: its first ``max_rows`` rows as DuckDB returns them; the schema's
        metadata holds ``truncated``, ``checkpoint_id`` and ``flushed_records`` (JSON text)."""
        return self._get("sql", {"query": query, "max_rows": max_rows})

    def states(self) -> list[tuple[str, str]]:
        """``(operator, state)`` of every state the server serves (its ``list_flights``)."""
        infos = self._call(lambda: list(self._client.list_flights(b"", self._options)))
        return [(i.descriptor.path[0].decode(), i.descriptor.path[1].decode()) for i in infos]
