"""The embedded engine of ``statelog sql`` and ``statelog inspect``: DuckDB, in-process.

Each view the query names becomes an Arrow table made by the readers of the ``statelog``
data sources (docs/spark.md), run here in one process instead of Spark's Python workers:

* a state view ``<operator>__<state>``: the state restored like one Spark partition
  covering every key group (:func:`statelog.readers.restore.restored_backend`: the table
  files the checkpoint's handles reference, then their changelog tail), turned into record
  batches by :func:`statelog.readers.state.state_batches` in the data source's schema;
* a change feed view ``<view>__changes`` (with ``--changes-from``):
  :func:`statelog.readers.changes.plan_feed` and ``feed_batches`` for each of the partitions
  Spark would read (``replay_order`` counts within one);
* a metadata view ``statelog_<table>``: the rows of :class:`statelog.readers.metadata.Catalog`
  in the schema of ``format("statelog-metadata")``.

The batches have Spark's own Arrow form of the data source's schema (``long`` as ``int64``,
``timestamp`` as ``timestamp[us, UTC]``, ``decimal(20,0)`` for ``uint64``, ...), so DuckDB
sees the column names and types Spark sees (docs/cli.md lists DuckDB's names for them).
Only the views the query names are built (a state is restored once per run).

DuckDB runs in memory and read-only for the query: one statement, which must be a query
(its own parser decides, after :func:`tools.sql.views.check_read_only`); file system access,
extension installs and Python variable scans are off and the configuration is locked before
the query runs, so a query reads the registered views and nothing else, and writes nowhere.
Every DuckDB error becomes one :class:`StatelogError` line.

The readers live in :mod:`statelog.readers`, which needs pyarrow only: this engine runs
without PySpark (and without Java).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from statelog.errors import StatelogError
from statelog.job import StateJob
from statelog.keys.groups import KeyGroupRange
from statelog.readers import options as opt
from statelog.readers.changes import feed_batches, plan_feed
from statelog.readers.metadata import Catalog, arrow_schema
from statelog.readers.restore import restored_backend
from statelog.readers.rows import key_group_partitions
from statelog.readers.schema import Columns, parse_key_type
from statelog.readers.state import state_batches, state_schema
from tools.sql.views import ViewPlan, open_job, plan_views, unknown_view

_CONFIG = {
    "enable_external_access": False,  # no file, URL or database but the registered views
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,  # no scan of Python variables named in the query
}


class ArrowViews:
    """The Arrow table of each view of a :class:`ViewPlan`, built on first use."""

    def __init__(self, plan: ViewPlan, options: Mapping[str, Any], key_type: str | None) -> None:
        self.plan = plan
        self.options = dict(options)
        self.key_type = key_type
        self.key_arrow = parse_key_type(key_type)
        self.job: StateJob = open_job(plan.root, options)
        self.manifests: dict[str, Any] = {}  # full manifests, shared by every state of the run
        self.catalog: Any = None

    def close(self) -> None:
        self.job.close()

    def __enter__(self) -> ArrowViews:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def table(self, name: str) -> pa.Table:
        plan = self.plan
        if name in plan.states:
            return self.state_table(*plan.states[name])
        if name in plan.changes:
            return self.change_table(*plan.changes[name])
        if name in plan.metadata:
            return self.metadata_table(plan.metadata[name])
        raise unknown_view(name, plan)

    def state_table(self, uid: str, state: str) -> pa.Table:
        """The rows of ``format("statelog")`` for one state at the plan's checkpoint."""
        meta = self.plan.meta
        op = opt.operator_of(meta, uid, self.plan.where)
        info = opt.state_of(op, state, self.plan.where)
        columns = Columns(state_schema(info, self.key_arrow))
        backend = restored_backend(self.job.store, meta, op, state, 0, 1, self.manifests)
        batches = state_batches(backend, info, self.key_arrow, meta.max_parallelism, columns)
        return _table(batches, columns.arrow)

    def change_table(self, uid: str, state: str) -> pa.Table:
        """The change feed of one state from ``--changes-from`` to the plan's checkpoint."""
        assert self.plan.changes_from is not None
        feed_options = {"root": self.plan.root, **opt.to_spark_options(self.options), "operator": uid, "state": state,
                        "changesFrom": self.plan.changes_from, "changesTo": self.plan.target}
        if self.key_type:
            feed_options["keyType"] = self.key_type
        feed = plan_feed(feed_options)
        columns = Columns(feed.schema())
        # Spark's partitions, read one after the other: replay_order counts within a partition
        # (it orders the rows of a key group), so the values are the ones Spark shows
        batches = [b for p in key_group_partitions(feed.max_parallelism, feed.partitions)
                   for b in feed_batches(self.job, feed, KeyGroupRange(p.start, p.end), columns)]
        return _table(batches, columns.arrow)

    def metadata_table(self, table: str) -> pa.Table:
        """The rows of ``format("statelog-metadata")`` (every retained checkpoint and savepoint)."""
        if self.catalog is None:
            self.catalog = Catalog(self.job)
        schema = arrow_schema(table)
        rows = list(self.catalog.rows(table))
        arrays = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)]
        return pa.Table.from_arrays(arrays, schema=schema)


def _table(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches(list(batches), schema=schema)


# -- running a query -----------------------------------------------------------------------------


def connect(views: ArrowViews, names: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the views ``names`` registered and everything else locked."""
    con = duckdb.connect(":memory:", config=dict(_CONFIG))
    try:
        con.execute("SET TimeZone = 'UTC'")  # timestamps come back as UTC, as Spark's are stored
        for name in names:
            con.register(name, views.table(name))
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def check_statement(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """One statement, a query (``SELECT``, ``WITH``, ``VALUES``, ``DESCRIBE``, ``SHOW``, or
    ``EXPLAIN`` of one) by DuckDB's own parser; a syntax error is one line."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as e:
        raise StatelogError(error_line(e)) from None
    if len(statements) != 1:
        raise StatelogError(f"statelog sql runs one statement, the query holds {len(statements)}")
    kind = statements[0].type
    if kind == duckdb.StatementType.EXPLAIN:
        inner = re.sub(r"^\s*EXPLAIN\s+(ANALYZE\s+)?", "", statements[0].query, flags=re.I)
        check_statement(con, inner)
    elif kind != duckdb.StatementType.SELECT:
        raise StatelogError(
            f"statelog sql runs read-only queries; this is a {kind.name} statement: use SELECT "
            "(or WITH, VALUES, SHOW, DESCRIBE, EXPLAIN)"
        )


def run_query(plan: ViewPlan, options: Mapping[str, Any], key_type: str | None, query: str,
              names: Sequence[str], max_rows: int) -> tuple[list[str], list[tuple]]:
    """Columns and the first ``max_rows + 1`` rows of ``query`` over the views ``names``."""
    with ArrowViews(plan, options, key_type) as views:
        probe = duckdb.connect(":memory:", config=dict(_CONFIG))
        try:
            check_statement(probe, query)  # before any state is read
        finally:
            probe.close()
        con = connect(views, names)
    try:
        try:
            cursor = con.execute(query)
            columns = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchmany(max_rows + 1)
        except duckdb.CatalogException as e:
            m = re.search(r"Table with name (.+?) does not exist", str(e))
            if m:
                raise unknown_view(m.group(1), plan) from None
            raise StatelogError(error_line(e)) from None
        except duckdb.Error as e:
            raise StatelogError(error_line(e)) from None
    finally:
        con.close()
    return columns, rows


class RowCounter:
    """Counts the rows of state views for :func:`tools.sql.views.inspect_report` (the same
    Arrow tables the views of ``statelog sql`` hold)."""

    def __init__(self, root: str, options: Mapping[str, Any]) -> None:
        self.root, self.options = root, dict(options)
        self.views: dict[str, ArrowViews] = {}

    def __call__(self, uid: str, state: str, target: str) -> int:
        if target not in self.views:
            self.views[target] = ArrowViews(plan_views(self.root, self.options, target), self.options, None)
        return self.views[target].state_table(uid, state).num_rows

    def close(self) -> None:
        for views in self.views.values():
            views.close()

    def __enter__(self) -> RowCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def error_line(e: BaseException) -> str:
    """DuckDB's message as one line: its text up to the excerpt of the query (``LINE 1: ...``)."""
    text = str(e).strip()
    head = re.split(r"\n\s*\n|\nLINE \d+:", text, maxsplit=1)[0]
    return " ".join(line.strip() for line in head.splitlines() if line.strip()) or type(e).__name__
