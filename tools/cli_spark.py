"""``statelog sql``, ``statelog inspect`` and ``statelog restore`` (docs/cli.md, docs/spark.md).

* ``sql ROOT QUERY`` runs a query over the views of a checkpoint (:mod:`tools.sql_views`: one
  per operator state, ``<operator>__<state>``, a change feed ``<view>__changes`` per state
  with ``--changes-from``, and ``statelog_<table>`` views of the metadata) and prints a table
  (or JSON rows).
* ``inspect ROOT`` lists operators and states of a checkpoint with their row counts.
* ``restore ROOT --checkpoint ID`` runs the restore/rescale job (:mod:`statelog.spark.rescale`)
  and writes a savepoint laid out for ``--parallelism``; a progress bar on a terminal.

``sql`` and ``inspect`` run on one of two engines (``--engine``): ``duckdb`` (the default:
in-process, :mod:`tools.sql_duckdb`) or ``spark`` (a SparkSession, ``--master``, default
``$STATELOG_SPARK_MASTER`` or ``local[*]``, with the ``statelog`` data sources registered;
``--master`` alone selects it). Both read through the data sources' readers, so a view has
the same rows and columns on both. ``restore`` always runs on Spark.

``sql`` and ``inspect`` only read; ``restore`` writes one savepoint. Exit codes: 0 ok,
2 usage or library error, one line on stderr (also errors raised inside Spark by the data
source, SQL errors of either engine, a statement that is not a query, and PySpark missing:
it is the ``spark`` extra, ``pip install 'statelog[spark]'``). This module imports
:mod:`statelog.spark` and the engines only inside the commands, so the other commands work
without PySpark (and start without importing DuckDB).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from statelog import errors as statelog_errors
from statelog.errors import ConfigError, StatelogError
from tools.output import _console, _json, _row, _table
from tools.sql_views import (  # noqa: F401 - view_names: re-exported for callers and tests
    ViewPlan,
    check_read_only,
    inspect_report,
    open_job,
    plan_views,
    print_inspect,
    print_result,
    referenced,
    unknown_view,
    view_names,
)

EXIT_OK = 0
ENGINES = ("duckdb", "spark")


def _verbosity(args: argparse.Namespace) -> int:
    return int(getattr(args, "verbose", 0) or 0) + int(getattr(args, "verbose_sub", 0) or 0)


# -- commands ------------------------------------------------------------------------------------


def register(commands: Any, command: Any) -> None:
    """Add ``sql``, ``inspect`` and ``restore`` (``command(group, name, handler, help)``)."""
    master_help = "Spark master (default: $STATELOG_SPARK_MASTER or local[*])"
    engine_help = ("duckdb (default: in-process) or spark (a SparkSession; --master alone selects it)")
    sql = command(commands, "sql", cmd_sql,
                  "run a read-only SQL query over the state of a checkpoint: one view per operator state "
                  "(<operator>__<state>), its change feed (<operator>__<state>__changes, with --changes-from) "
                  "and statelog_<table> views of the metadata")
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
    sql.add_argument("--engine", choices=ENGINES, default=None, help=engine_help)
    sql.add_argument("--master", default=None, help=master_help)
    inspect = command(commands, "inspect", cmd_inspect,
                      "summarize a checkpoint's operators and states with their row counts")
    inspect.add_argument("--checkpoint", default="latest", metavar="ID",
                         help="checkpoint id, latest (default) or savepoint:NAME")
    inspect.add_argument("--no-count", action="store_true", help="skip the row counts (reads only metadata)")
    inspect.add_argument("--engine", choices=ENGINES, default=None, help=engine_help)
    inspect.add_argument("--master", default=None, help=master_help)
    restore = command(commands, "restore", cmd_restore,
                      "restore a checkpoint with Spark into a savepoint laid out for a new parallelism")
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
    restore.add_argument("--master", default=None, help=master_help)


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


# what --master may name (Spark 4): local modes, a standalone master, YARN, Kubernetes
_MASTER = re.compile(
    r"^(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://\S+|yarn|k8s://\S+)$"
)
# pyspark's own Python loggers (e.g. the JSON lines of SQLQueryContextLogger on a SQL error)
_PYSPARK_LOGGERS = ("pyspark", "py4j", "SQLQueryContextLogger")


def check_master(master: str | None) -> str | None:
    """``master`` if Spark can start with it; a one-line ConfigError otherwise."""
    if master is not None and not _MASTER.match(master.strip()):
        raise ConfigError(
            f"--master: Spark does not know the master {master!r}; use local[*], local[N], "
            "spark://HOST:PORT, yarn or k8s://URL"
        )
    return master.strip() if master is not None else None


def _jvm_failure(log_text: str) -> str | None:
    """Why a Spark JVM did not start, from its log: the reason Spark gave up (``Reason: ...``
    of an ERROR line), the first cause (``Caused by: ...``), or its exception line."""
    lines = log_text.splitlines()

    def first(pattern: str) -> str | None:
        for line in lines:
            m = re.search(pattern, line)
            if m:
                return m.group(1).strip()
        return None

    main = first(r'Exception in thread "main" [\w.$]+: (.+)$')
    reason = first(r" ERROR .*Reason: (.+)$")
    cause = first(r"^Caused by: [\w.$]+: (.+)$")
    exception = first(r"^\s*(?:[\w.$]+\.)?\w*(?:Exception|Error): (.+)$")
    parts = [p for p in (main or reason, cause) if p]
    if parts:
        return parts[0] + (f" ({parts[1]})" if len(parts) > 1 else "")
    return exception


@contextlib.contextmanager
def _silenced(verbose: int) -> Iterator[None]:
    """pyspark's Python loggers silenced for the command, unless ``-v``."""
    levels = {n: logging.getLogger(n).level for n in _PYSPARK_LOGGERS}
    if not verbose:
        for n in _PYSPARK_LOGGERS:
            logging.getLogger(n).setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


def _start_quietly(master: str | None, log_file: Path, verbose: int) -> Any:
    """Start the SparkSession with the JVM's stderr on ``log_file`` unless ``-v``: the JVM
    (and the Python workers it starts later) inherit it while this process's stderr is the
    terminal again as soon as the JVM runs."""
    import statelog.spark

    if verbose:
        return statelog.spark.session(master, app_name="statelog-cli")
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(fd, 2)
        return statelog.spark.session(master, app_name="statelog-cli")
    finally:
        os.close(fd)
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def _spark(master: str | None, verbose: int = 0) -> Iterator[Any]:
    """A local SparkSession for one command (an active session of the caller is reused, not stopped).

    Spark's console output (JVM warnings, log4j lines, Python worker errors) goes to a log
    file unless ``-v`` (deleted after a command that succeeded); a JVM that does not start is
    one error line with its reason."""
    import statelog.spark  # without PySpark: a MissingDependencyError naming the extra

    master = check_master(master)
    active = statelog.spark.SparkSession.getActiveSession()
    if active is not None:
        with _silenced(verbose):
            yield statelog.spark.register(active)
        return
    log_file = Path(tempfile.mkstemp(prefix="statelog-spark-", suffix=".log")[1])
    with _silenced(verbose):
        try:
            spark = _start_quietly(master, log_file, verbose)
        except Exception as e:  # noqa: BLE001 - the JVM's reason is in its log, not in e
            reason = _jvm_failure(log_file.read_text(errors="replace")) or str(e).strip().splitlines()[0]
            raise StatelogError(
                f"Spark did not start (master {master or 'local[*]'!r}): {reason}; its log: {log_file}"
            ) from None
        try:
            yield spark
        finally:
            spark.stop()
    log_file.unlink(missing_ok=True)


@contextlib.contextmanager
def _errors(plan: ViewPlan | None = None) -> Iterator[None]:
    """Errors raised inside Spark (the data source runs in Python workers) as StatelogError;
    a view the query names that ``plan`` lacks is the same error line as on DuckDB."""
    try:
        yield
    except StatelogError:
        raise
    except Exception as e:  # noqa: BLE001 - py4j/pyspark errors carry our message in their text
        from pyspark.errors import PySparkException

        message = spark_error_message(e)
        if message is None and isinstance(e, PySparkException):  # e.g. a SQL error in the query
            missing = re.search(r"\[TABLE_OR_VIEW_NOT_FOUND\] The table or view `?([^`\s]+)`? cannot be found", str(e))
            if plan is not None and missing:
                raise unknown_view(missing.group(1), plan) from None
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if message is None:
            raise
        raise StatelogError(message) from None


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


def spark_error_message(e: BaseException) -> str | None:
    """The statelog error inside a Spark error's text (``ConfigError: ...``), else ``None``."""
    names = {n for n in dir(statelog_errors) if n.endswith("Error")}
    for line in reversed(str(e).splitlines()):
        m = _ERROR_LINE.match(line)
        if m and m.group(1) in names:
            return m.group(2).strip()
    return None


def register_views(spark: Any, plan: ViewPlan, options: dict[str, Any], key_type: str | None,
                   only: Sequence[str] | None = None) -> None:
    """Create the temporary views of ``plan`` in ``spark`` (``only``: just these names)."""
    from statelog.spark import METADATA_FORMAT, STATE_FORMAT
    from statelog.spark import options as opt

    spark_opts = {"root": plan.root, **opt.to_spark_options(options)}
    if key_type:
        spark_opts["keyType"] = key_type
    wanted = set(only) if only is not None else set(plan.names)
    for name, (uid, state) in plan.states.items():
        if name in wanted:
            spark.read.format(STATE_FORMAT).options(**spark_opts).option("checkpoint", plan.target) \
                .option("operator", uid).option("state", state).load().createOrReplaceTempView(name)
    for name, (uid, state) in plan.changes.items():
        if name in wanted:
            spark.read.format(STATE_FORMAT).options(**spark_opts).option("changesFrom", plan.changes_from) \
                .option("changesTo", plan.target).option("operator", uid).option("state", state).load() \
                .createOrReplaceTempView(name)
    for name, table in plan.metadata.items():
        if name in wanted:
            spark.read.format(METADATA_FORMAT).options(**{k: v for k, v in spark_opts.items() if k != "keyType"}) \
                .option("table", table).load().createOrReplaceTempView(name)


def spark_query(spark: Any, plan: ViewPlan, options: dict[str, Any], key_type: str | None, query: str,
                names: Sequence[str], max_rows: int) -> tuple[list[str], list[tuple]]:
    """Columns and the first ``max_rows + 1`` rows of ``query`` on Spark (timestamps in UTC).
    The temporary views are dropped afterwards (a session of the caller is left as it was)."""
    try:
        register_views(spark, plan, options, key_type, names)
        df = spark.sql(query)
        rows = df.limit(max_rows + 1).collect()
        types = [f.dataType for f in df.schema.fields]
        return list(df.columns), [tuple(_utc(v, t) for v, t in zip(r, types, strict=True)) for r in rows]
    finally:
        for name in names:
            spark.catalog.dropTempView(name)


def _utc(value: Any, spark_type: Any) -> Any:
    """A value of a Spark ``timestamp`` (PySpark returns naive local times) as an aware UTC
    datetime, in nested values too: DuckDB returns them so, and both print alike."""
    from pyspark.sql.types import ArrayType, MapType, StructType, TimestampType

    if value is None:
        return None
    if isinstance(spark_type, TimestampType) and isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC)
    if isinstance(spark_type, ArrayType):
        return [_utc(v, spark_type.elementType) for v in value]
    if isinstance(spark_type, MapType):
        return {_utc(k, spark_type.keyType): _utc(v, spark_type.valueType) for k, v in value.items()}
    if isinstance(spark_type, StructType):
        return {f.name: _utc(value[f.name], f.dataType) for f in spark_type.fields}
    return value


def cmd_sql(args: argparse.Namespace, options: dict[str, Any]) -> int:
    import statelog.spark  # noqa: F401 - without PySpark: the MissingDependencyError naming the extra
    from statelog.spark.schema import parse_key_type

    parse_key_type(args.key_type)
    check_read_only(args.query)
    engine = engine_of(args)
    check_master(args.master)
    # the root, the checkpoint and --changes-from are checked before an engine starts
    plan = plan_views(args.root, options, args.checkpoint, args.changes_from)
    used = referenced(args.query, plan.names)
    if engine == "duckdb":
        from tools.sql_duckdb import run_query

        columns, rows = run_query(plan, options, args.key_type, args.query, used, args.max_rows)
    else:
        with _spark(args.master, _verbosity(args)) as spark, _errors(plan):
            columns, rows = spark_query(spark, plan, options, args.key_type, args.query, used, args.max_rows)
    print_result(columns, rows, args.max_rows, args.json)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace, options: dict[str, Any]) -> int:
    import statelog.spark  # noqa: F401 - without PySpark: the MissingDependencyError naming the extra

    engine = engine_of(args)
    check_master(args.master)
    if args.no_count:
        report = inspect_report(args.root, options, args.checkpoint, None)
    elif engine == "duckdb":
        from tools.sql_duckdb import RowCounter

        with RowCounter(args.root, options) as counter:
            report = inspect_report(args.root, options, args.checkpoint, counter)
    else:
        with _spark(args.master, _verbosity(args)) as spark, _errors():
            report = inspect_report(args.root, options, args.checkpoint, _spark_counter(spark, args.root, options))
    print_inspect(report, args.json)
    return EXIT_OK


def _spark_counter(spark: Any, root: str, options: dict[str, Any]) -> Any:
    """Rows of a state view on Spark (one count job per state)."""
    from statelog.spark import STATE_FORMAT
    from statelog.spark import options as opt

    def count(uid: str, state: str, target: str) -> int:
        return int(spark.read.format(STATE_FORMAT).options(root=root, **opt.to_spark_options(options))
                   .option("checkpoint", target).option("operator", uid).option("state", state).load().count())

    return count


def cmd_restore(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from statelog.spark.rescale import parse_renames, prepare, restore

    renames = parse_renames(args.rename_operator)
    job = open_job(args.root, options)  # check everything (also that the savepoint can be written) before Spark
    try:
        plan = prepare(job, args.checkpoint, parallelism=args.parallelism, savepoint=args.savepoint,
                       drop=args.drop_operator, rename=renames)
    finally:
        job.close()
    with _spark(args.master, _verbosity(args)) as spark, _errors(), _progress(not args.json) as progress:
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
