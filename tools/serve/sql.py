"""SQL over a follower's replica with DuckDB, read-only, for ``statelog serve``.

The views are the ones ``statelog sql`` names (:func:`tools.sql.views.view_names`):
``<operator>__<state>`` (timers: ``<operator>__timers_event`` / ``__timers_processing``),
with the columns of ``format("statelog")`` (``key_group``, ``key``, ..., ``namespace``,
``value``...). A query names the views it reads; each is built from the replica as an Arrow
table, all of them from one state (the follower's lock is held while they are built), and
kept until the replica moves (another checkpoint, or more flushed changes), so repeated
queries of one state build it once.

Only one statement that is a query is accepted (:func:`tools.sql.views.check_read_only`, then
DuckDB's own parser); DuckDB runs in memory with external access, extension loading and
Python variable scans off and its configuration locked, as in ``statelog sql``.
"""

from __future__ import annotations

import datetime
import decimal
import re
import threading
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import duckdb
import pyarrow as pa

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError, StatelogError
from statelog.following.follower import Follower
from statelog.following.json_values import to_json
from statelog.following.replica import OperatorReplica
from statelog.readers import options as opt
from statelog.readers.schema import Columns
from statelog.readers.state import state_batches, state_schema
from statelog.state.backend import KeyedStateBackend
from tools.sql.duckdb import check_statement, connect, error_line
from tools.sql.views import check_read_only, referenced, view_names

__all__ = ["DEFAULT_MAX_ROWS", "ReplicaSQL", "SQLError", "SQLResult", "json_rows"]

DEFAULT_MAX_ROWS = 10_000


class SQLError(StatelogError):
    """A query the server refuses with ``status``."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class SQLResult:
    """A query's answer: an Arrow table (its first ``max_rows`` rows) and the state it read."""

    def __init__(self, table: pa.Table, truncated: bool, checkpoint_id: int | None, flushed_records: int) -> None:
        self.table, self.truncated = table, truncated
        self.checkpoint_id, self.flushed_records = checkpoint_id, flushed_records


class _Tables:
    """The ``table(name)`` that :func:`tools.sql.duckdb.connect` registers."""

    def __init__(self, tables: Mapping[str, pa.Table]) -> None:
        self.tables = tables

    def table(self, name: str) -> pa.Table:
        return self.tables[name]


def _state_table(meta: CheckpointMetadata, backend: KeyedStateBackend, uid: str, state: str) -> pa.Table:
    where = f"checkpoint {meta.checkpoint_id}"
    info = opt.state_of(opt.operator_of(meta, uid, where), state, where)
    columns = Columns(state_schema(info, None))
    backend.wait_loaded()  # an on-demand replica: every key group
    batches = list(state_batches(backend, info, None, meta.max_parallelism, columns))
    return pa.Table.from_batches(batches, schema=columns.arrow)


class ReplicaSQL:
    """Runs read-only queries over the views of a follower's replica."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower
        self._cache_lock = threading.Lock()
        self._version: tuple[int | None, int] | None = None
        self._cache: dict[str, pa.Table] = {}
        self._db: duckdb.DuckDBPyConnection | None = None

    def prepare(self) -> None:
        """Open the database and make pyarrow's first conversion of Python objects (which
        imports pandas, 0.3-1 s) now, when the server starts, instead of in its first query."""
        with self._cache_lock:
            if self._db is None:
                self._db = connect(_Tables({}), [])  # type: ignore[arg-type]  # (any object with table(name))
        pa.array([0], pa.int64())

    def _tables(self, query: str) -> tuple[dict[str, pa.Table], int | None, int]:
        def build(meta: CheckpointMetadata | None, replicas: dict[str, OperatorReplica],
                  ahead: int) -> tuple[dict[str, pa.Table], int | None, int]:
            if meta is None:
                raise StatelogError(f"{self.follower.root} has no completed checkpoint yet: there is no state to query")
            views = {n: t for n, t in view_names(meta).items() if t[0] in replicas}
            names = referenced(query, list(views))
            with self._cache_lock:
                if self._version != (meta.checkpoint_id, ahead):
                    self._version, self._cache = (meta.checkpoint_id, ahead), {}
                for name in names:
                    if name not in self._cache:
                        uid, state = views[name]
                        self._cache[name] = _state_table(meta, replicas[uid].backend, uid, state)
                return {n: self._cache[n] for n in names}, meta.checkpoint_id, ahead

        return self.follower.with_replicas(build)

    def run(self, query: str, max_rows: int = DEFAULT_MAX_ROWS) -> SQLResult:
        """The first ``max_rows`` rows of ``query`` (``SQLError`` 400 for a statement that is
        not one query or that DuckDB refuses)."""
        try:
            check_read_only(query)
        except ConfigError as e:
            raise SQLError(HTTPStatus.BAD_REQUEST, str(e).replace("statelog sql", "SQL over statelog serve")) from None
        with self._cache_lock:
            if self._db is None:  # one locked in-memory database; a cursor (connection) per query
                self._db = connect(_Tables({}), [])  # type: ignore[arg-type]  # (any object with table(name))
            con = self._db.cursor()
        try:
            try:
                check_statement(con, query)
            except StatelogError as e:
                raise SQLError(HTTPStatus.BAD_REQUEST, str(e).replace("statelog sql", "SQL over statelog serve")) from None
            tables, checkpoint_id, ahead = self._tables(query)
            for name, table in tables.items():
                con.register(name, table)
            reader = con.sql(query).to_arrow_reader(min(max_rows + 1, 1 << 20))
            batches, rows = [], 0
            for batch in reader:
                batches.append(batch)
                rows += batch.num_rows
                if rows > max_rows:
                    break
            table = pa.Table.from_batches(batches, schema=reader.schema)
        except duckdb.CatalogException as e:
            m = re.search(r"Table with name (.+?) does not exist", str(e))
            detail = (f"no view {m.group(1)!r}; the views are named <operator>__<state> "
                      "(as statelog sql names them)") if m else error_line(e)  # fmt: skip
            raise SQLError(HTTPStatus.BAD_REQUEST, detail) from None
        except duckdb.Error as e:
            raise SQLError(HTTPStatus.BAD_REQUEST, error_line(e)) from None
        finally:
            con.close()
        return SQLResult(table.slice(0, max_rows), table.num_rows > max_rows, checkpoint_id, ahead)


def _cell(v: Any) -> Any:
    if isinstance(v, datetime.datetime | datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else str(v)
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, list):
        return [_cell(x) for x in v]
    if isinstance(v, dict):
        return {k: _cell(x) for k, x in v.items()} if all(isinstance(k, str) for k in v) else to_json(v)
    return to_json(v)


def json_rows(result: SQLResult) -> dict[str, Any]:
    """The HTTP answer of a query: ``columns``, ``rows`` (lists), ``truncated`` and the state read."""
    return {
        "columns": result.table.column_names,
        "rows": [[_cell(r[c]) for c in result.table.column_names] for r in result.table.to_pylist()],
        "truncated": result.truncated, "checkpoint_id": result.checkpoint_id, "flushed_records": result.flushed_records,
    }  # fmt: skip
