"""The client of ``statelog serve``: :func:`query` returns a :class:`QueryClient` (urllib only).

Values come back decoded as :mod:`statelog.following.json_values` describes (bytes, maps with
non-string keys, non-finite floats as themselves; a tuple value as a list). A refused or
failed request raises :class:`~statelog.errors.QueryError` with the server's message and the
HTTP status; the token never appears in a message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from statelog.errors import ConfigError, QueryError
from statelog.following.json_values import from_json, key_from_json, to_json
from statelog.following.position import Read

if TYPE_CHECKING:
    from statelog.flight_client import FlightQueryClient

__all__ = ["QueryClient", "query"]

_ALL = object()  # a scan of every namespace


class QueryClient:
    """Lookups in the state a ``statelog serve`` server follows (see :func:`query`)."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"statelog.query: expected the server's URL http://HOST:PORT/ (or grpc://HOST:PORT for "
                              f"Arrow Flight), got {url!r}")
        if not token:
            raise ConfigError("statelog.query: expected the server's token (token=...), got none")
        self.url = url.rstrip("/") + "/"
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"QueryClient({self.url!r})"

    def _request(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if data is None else "POST")
        req.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read())["error"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {e.code} {e.reason}"
            raise QueryError(f"{self.url}: {message}", status=e.code) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise QueryError(f"cannot reach {self.url}: {reason}; check that statelog serve runs there") from None

    def position(self) -> dict[str, Any]:
        """The server's follower position: ``checkpoint_id``, ``consistency``, ``exact``,
        ``flushed_records``, ``lag_s``, ``data_lag_s``, ``lag_checkpoints``, ``restores`` and
        the ``operators`` it follows."""
        return dict(self._request("v1/position"))

    def read(self, operator: str, state: str, key: Any, namespace: Any = None) -> Read:
        """The value at ``key`` (and ``namespace``) with the checkpoint it was read at."""
        args = {"key": json.dumps(to_json(key))}
        if namespace is not None:
            args["namespace"] = json.dumps(to_json(namespace))
        path = f"v1/state/{quote(operator, safe='')}/{quote(state, safe='')}?{urlencode(args)}"
        out = self._request(path)
        return Read(from_json(out["value"]), out["checkpoint_id"], out["flushed_records"])

    def get(self, operator: str, state: str, key: Any, namespace: Any = None) -> Any:
        """The value of ``state`` of ``operator`` at ``key`` (and ``namespace``)."""
        return self.read(operator, state, key, namespace).value

    def read_many(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> Read:
        """The values at each of ``keys``, read from the same state (``Read.value``: the list)."""
        body: dict[str, Any] = {"operator": operator, "state": state, "keys": [to_json(k) for k in keys]}
        if namespace is not None:
            body["namespace"] = to_json(namespace)
        out = self._request("v1/lookup", body)
        return Read([from_json(v) for v in out["values"]], out["checkpoint_id"], out["flushed_records"])

    def get_many(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> list[Any]:
        """The values at each of ``keys`` (one request), in their order."""
        return list(self.read_many(operator, state, keys, namespace).value)


    def scan_pages(self, operator: str, state: str, *, start: Any = None, end: Any = None, key_group: int | None = None,
                   namespace: Any = _ALL, limit: int = 1000) -> Iterator[Read]:
        """The entries of ``state`` of ``operator`` page by page (``limit`` entries a request):
        keys ``start <= key < end`` (each bound optional), of ``key_group``, in ``namespace``
        (default: every namespace). Each :class:`Read` holds a list of ``(key, namespace,
        value)``; the pages are all of one checkpoint (``QueryError`` with status 409 when the
        server moved on during the scan: scan again)."""
        args: dict[str, str] = {"limit": str(limit)}
        if start is not None:
            args["from"] = json.dumps(to_json(start))
        if end is not None:
            args["to"] = json.dumps(to_json(end))
        if key_group is not None:
            args["key_group"] = str(key_group)
        if namespace is not _ALL:
            args["namespace"] = json.dumps(to_json(namespace))
        path = f"v1/scan/{quote(operator, safe='')}/{quote(state, safe='')}?"
        while True:
            out = self._request(path + urlencode(args))
            entries = [(key_from_json(k, "key"), key_from_json(ns, "namespace"), from_json(v)) for k, ns, v in out["entries"]]
            yield Read(entries, out["checkpoint_id"], out["flushed_records"])
            if out["next"] is None:
                return
            args["cursor"] = out["next"]

    def scan(self, operator: str, state: str, **kwargs: Any) -> Iterator[tuple[Any, Any, Any]]:
        """``(key, namespace, value)`` of the entries :meth:`scan_pages` returns, one by one."""
        for page in self.scan_pages(operator, state, **kwargs):
            yield from page.value

    def sql(self, query: str, max_rows: int = 10_000) -> dict[str, Any]:
        """A read-only query (one ``SELECT`` or ``WITH``) over the replica's views
        ``<operator>__<state>``: ``{"columns", "rows", "truncated", "checkpoint_id",
        "flushed_records"}`` with its first ``max_rows`` rows (cells decoded as values are:
        bytes as bytes; timestamps as ISO 8601 strings)."""
        out = dict(self._request("v1/sql", {"query": query, "max_rows": max_rows}))
        out["rows"] = [[from_json(cell) for cell in row] for row in out["rows"]]
        return out


def query(url: str, token: str, timeout: float = 30.0) -> QueryClient | FlightQueryClient:
    """A client of the ``statelog serve`` server at ``url`` with its ``token`` (docs/follow.md,
    "Serving it"): ``http://HOST:PORT/`` (the HTTP server) gives a :class:`QueryClient`,
    ``grpc://HOST:PORT`` (``--flight-port``) a :class:`~statelog.flight_client.FlightQueryClient`
    with the same methods and Arrow answers."""
    if url.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
        from statelog.flight_client import FlightQueryClient  # pyarrow.flight only for a Flight URL

        return FlightQueryClient(url, token, timeout)
    return QueryClient(url, token, timeout)
