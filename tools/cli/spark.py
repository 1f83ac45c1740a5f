"""``statelog sql``, ``statelog inspect`` and ``statelog restore`` (docs/cli.md, docs/spark.md).

* ``sql ROOT QUERY`` runs a query over the views of a checkpoint (:mod:`tools.sql.views`: one
  per operator state, ``<operator>__<state>``, a change feed ``<view>__changes`` per state
  with ``--changes-from``, and ``statelog_<table>`` views of the metadata) and prints a table
  (or JSON rows).
* ``inspect ROOT`` lists operators and states of a checkpoint with their row counts.
* ``restore ROOT --checkpoint ID`` runs the restore/rescale job (:mod:`statelog.spark.rescale`)
  and writes a savepoint laid out for ``--parallelism``; a progress bar on a terminal.

``sql`` and ``inspect`` run on one of two engines (``--engine``): ``duckdb`` (the default:
in-process, :mod:`tools.sql.duckdb`) or ``spark`` (:mod:`tools.sql.spark` in a SparkSession
of :mod:`tools.cli.spark_session`, ``--master``, default ``$STATELOG_SPARK_MASTER`` or
``local[*]``, with the ``statelog`` data sources registered; ``--master`` alone selects it).
Both read through the data sources' readers (:mod:`statelog.readers`), so a view has the
same rows and columns on both. ``restore`` always runs on Spark.

``sql`` and ``inspect`` only read; ``restore`` writes one savepoint. Exit codes: 0 ok,
2 usage or library error, one line on stderr (also errors raised inside Spark by the data
source, SQL errors of either engine, a statement that is not a query, and PySpark missing
for ``--engine spark`` or ``restore``: it is the ``spark`` extra, ``pip install
'statelog[spark]'``). The DuckDB engine reads through :mod:`statelog.readers` (pyarrow only),
so ``sql`` and ``inspect`` work without PySpark and Java. This module imports
:mod:`statelog.spark`, the readers and DuckDB only inside the commands, so the other commands
start without them.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import decimal
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from statelog.errors import ConfigError
from tools.cli import spark_session
from tools.cli.output import _console, _json, _row, _table
from tools.sql.spark import row_counter, spark_query
from tools.sql.views import check_read_only, inspect_report, open_job, plan_views, referenced

EXIT_OK = 0
ENGINES = ("duckdb", "spark")


# -- commands ------------------------------------------------------------------------------------


# the arguments of the commands (their names and help texts are in tools.cli.commands)
_MASTER_HELP = "Spark master (default: $STATELOG_SPARK_MASTER or local[*])"
_ENGINE_HELP = "duckdb (default: in-process) or spark (a SparkSession; --master alone selects it)"


def declare_sql(sql: argparse.ArgumentParser) -> None:
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT key, value FROM counter__count LIMIT 10"')
    sql.add_argument("--checkpoint", default="latest", metavar="ID",
                     help="checkpoint id, latest (default) or savepoint:NAME")
    sql.add_argument("--key-type", metavar="TYPE", default=None,
                     help="Arrow type of the keys (string, int64, ...): a typed key column in every view")
    sql.add_argument("--max-rows", metavar="N", type=_count, default=1000,
                     help="print at most N rows (default 1000)")
    sql.add_argument("--changes-from", metavar="ID", default=None,
                     help="add a change feed view <view>__changes per state: the changes after checkpoint ID "
                          "up to --checkpoint")
    sql.add_argument("--engine", choices=ENGINES, default=None, help=_ENGINE_HELP)
    sql.add_argument("--master", default=None, help=_MASTER_HELP)


def declare_inspect(inspect: argparse.ArgumentParser) -> None:
    inspect.add_argument("--checkpoint", default="latest", metavar="ID",
                         help="checkpoint id, latest (default) or savepoint:NAME")
    inspect.add_argument("--no-count", action="store_true", help="skip the row counts (reads only metadata)")
    inspect.add_argument("--engine", choices=ENGINES, default=None, help=_ENGINE_HELP)
    inspect.add_argument("--master", default=None, help=_MASTER_HELP)


def declare_restore(restore: argparse.ArgumentParser) -> None:
    restore.add_argument("--checkpoint", required=True, metavar="ID",
                         help="checkpoint id, latest or savepoint:NAME to restore")
    restore.add_argument("--parallelism", type=int, default=None, metavar="P",
                         help="new parallelism of every operator, 1..max_parallelism (default: keep each)")
    restore.add_argument("--savepoint", default=None, metavar="NAME",
                         help="name of the savepoint to write (default restore-<id>[-p<P>]-<UTC time>)")
    restore.add_argument("--drop-operator", action="append", default=[], metavar="UID",
                         help="leave this operator's state out (repeatable)")
    restore.add_argument("--rename-operator", action="append", default=[], metavar="OLD=NEW",
                         help="store operator OLD's state under uid NEW (repeatable)")
    restore.add_argument("--master", default=None, help=_MASTER_HELP)


def _count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: use a whole number >= 1")
    return int(text)


def engine_of(args: argparse.Namespace) -> str:
    """``--engine``, else ``spark`` when ``--master`` is given, else ``duckdb``."""
    if args.engine is None:
        return "spark" if args.master is not None else "duckdb"
    if args.engine == "duckdb" and args.master is not None:
        raise ConfigError("--master applies to --engine spark only; drop it, or use --engine spark")
    return str(args.engine)
def cmd_sql(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from statelog.readers.schema import parse_key_type

    engine = engine_of(args)
    if engine == "spark":
        import statelog.spark  # noqa: F401 - without PySpark: the MissingDependencyError naming the extra
    parse_key_type(args.key_type)
    check_read_only(args.query)
    spark_session.check_master(args.master)
    # the root, the checkpoint and --changes-from are checked before an engine starts
    plan = plan_views(args.root, options, args.checkpoint, args.changes_from)
    used = referenced(args.query, plan.names)
    if engine == "duckdb":
        from tools.sql.duckdb import run_query

        columns, rows = run_query(plan, options, args.key_type, args.query, used, args.max_rows)
    else:
        with spark_session.session(args.master, spark_session.verbosity(args)) as spark, \
                spark_session.one_line_errors(plan):
            columns, rows = spark_query(spark, plan, options, args.key_type, args.query, used, args.max_rows)
    print_result(columns, rows, args.max_rows, args.json)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace, options: dict[str, Any]) -> int:
    if args.no_count and (args.engine is not None or args.master is not None):
        flag = "--engine" if args.engine is not None else "--master"
        raise ConfigError(f"{flag} chooses the engine that counts rows, and --no-count counts none; drop {flag}, "
                          "or drop --no-count")
    engine = engine_of(args)
    if engine == "spark":
        import statelog.spark  # noqa: F401 - without PySpark: the MissingDependencyError naming the extra
    spark_session.check_master(args.master)
    if args.no_count:
        report = inspect_report(args.root, options, args.checkpoint, None)
    elif engine == "duckdb":
        from tools.sql.duckdb import RowCounter

        with RowCounter(args.root, options) as counter:
            report = inspect_report(args.root, options, args.checkpoint, counter)
    else:
        with spark_session.session(args.master, spark_session.verbosity(args)) as spark, \
                spark_session.one_line_errors():
            report = inspect_report(args.root, options, args.checkpoint, row_counter(spark, args.root, options))
    print_inspect(report, args.json)
    return EXIT_OK


def cmd_restore(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from statelog.spark.rescale.driver import prepare, restore
    from statelog.spark.rescale.plan import parse_renames

    renames = parse_renames(args.rename_operator)
    job = open_job(args.root, options)  # check everything (also that the savepoint can be written) before Spark
    try:
        plan = prepare(job, args.checkpoint, parallelism=args.parallelism, savepoint=args.savepoint,
                       drop=args.drop_operator, rename=renames)
    finally:
        job.close()
    with spark_session.session(args.master, spark_session.verbosity(args)) as spark, \
            spark_session.one_line_errors(), _progress(not args.json) as progress:
        result = restore(spark, args.root, args.checkpoint, parallelism=args.parallelism,
                         savepoint=plan.name, drop=args.drop_operator, rename=renames,
                         store_options=options, progress=progress, plan=plan)
    data = result.to_json()
    if args.json:
        _json(data)
        return EXIT_OK
    console = _console()
    console.print(f"wrote savepoint {data['savepoint']} of {data['source']}: {data['rows']} rows in "
                  f"{data['files']} files ({data['bytes']} bytes), {data['tasks']} Spark task(s), "
                  f"{data['seconds']:.1f}s", soft_wrap=True)
    table = _table(None, "operator", "from", "parallelism", "rows", "files", right=("parallelism", "rows", "files"))
    for uid, op in data["operators"].items():
        _row(table, uid, op["from"], op["parallelism"], op["rows"], op["files"])
    console.print(table)
    if data["dropped"]:
        console.print(f"dropped: {', '.join(data['dropped'])}", soft_wrap=True)
    console.print(f"restore with: job.backend(UID, subtask=i, parallelism=P, restore=\"{data['restore']}\")",
                  soft_wrap=True)
    return EXIT_OK


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A progress bar on stderr when it is a terminal (else no progress output)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    with Progress(TextColumn("restore"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task("restore", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


# -- printing ------------------------------------------------------------------------------------


def print_inspect(report: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        _json(report)
        return
    console = _console()
    what = f"savepoint {report['savepoint']} (checkpoint {report['checkpoint_id']})" if report["savepoint"] \
        else f"checkpoint {report['checkpoint_id']}"
    console.print(f"{what} of {report['root']}: max_parallelism {report['max_parallelism']}, "
                  f"sources {json.dumps(report['sources'], default=str)}", soft_wrap=True)
    for op in report["operators"]:
        table = _table(f"Operator {op['uid']} (parallelism {op['parallelism']})", "state", "kind", "value type",
                       "map key type", "ttl (ms)", "rows", "changelog records", "materialized rows", "view",
                       right=("rows", "changelog records", "materialized rows"))
        unused = [s["view"] for s in op["states"] if s.get("used") is False]  # timer states without timers
        for s in op["states"]:
            if s.get("used") is not False:
                _row(table, s["name"], s["kind"], s["value_type"], s["user_key_type"], s["ttl_ms"], s["rows"],
                     s["changelog_records"], s["materialized_rows"], s["view"])
        console.print()
        console.print(table)
        if unused:
            console.print(f"no timers (empty views): {', '.join(unused)}", soft_wrap=True)


def print_result(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_rows: int, as_json: bool) -> None:
    """``rows`` (at most ``max_rows + 1``: one more says the result was cut) as a table or JSON."""
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    if as_json:
        _json([{c: plain(r[i]) for i, c in enumerate(columns)} for r in rows])
        return
    console = _console()
    table = _table(None, *columns)
    for r in rows:
        _row(table, *(cell(v) for v in r))
    console.print(table)
    console.print(f"{len(rows)} row(s)" + (f" (first {max_rows}; use --max-rows)" if truncated else ""))


def plain(v: Any) -> Any:
    """A JSON value: bytes as base64 ({"base64": ...}), dates ISO, decimals as strings, rows as objects."""
    if isinstance(v, bytes | bytearray):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if hasattr(v, "asDict"):
        return {k: plain(x) for k, x in v.asDict().items()}
    if isinstance(v, dict):
        return {str(plain(k)) if not isinstance(k, str) else k: plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return v


def cell(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes | bytearray):
        return "0x" + bytes(v).hex()
    if isinstance(v, str):
        return v
    return json.dumps(plain(v), default=str)
