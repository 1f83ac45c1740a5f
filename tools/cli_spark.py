"""``statelog sql``, ``statelog inspect`` and ``statelog restore``: the Spark commands (docs/spark.md).

They start a local SparkSession (``--master``, default ``$STATELOG_SPARK_MASTER`` or
``local[*]``) with the ``statelog`` data sources registered (:mod:`statelog.spark`).

* ``sql ROOT QUERY`` registers one temporary view per operator state of the checkpoint
  (:func:`view_names`) plus ``statelog_<table>`` views of the metadata, runs the query and
  prints a table (or JSON rows).
* ``inspect ROOT`` lists operators and states of a checkpoint with their row counts.
* ``restore ROOT --checkpoint ID`` runs the restore/rescale job (:mod:`statelog.spark.rescale`)
  and writes a savepoint laid out for ``--parallelism``; a progress bar on a terminal.

``sql`` and ``inspect`` only read; ``restore`` writes one savepoint. Exit codes: 0 ok,
2 usage or library error (also errors raised inside Spark by the data source, and PySpark
missing: it is the ``spark`` extra, ``pip install 'statelog[spark]'``). This module imports
:mod:`statelog.spark` only inside the commands, so the other commands work without PySpark.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import decimal
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from statelog import errors as statelog_errors
from statelog.errors import ConfigError, StatelogError
from statelog.job import StateJob
from tools.output import _console, _json, _row, _table

EXIT_OK = 0


def _verbosity(args: argparse.Namespace) -> int:
    return int(getattr(args, "verbose", 0) or 0) + int(getattr(args, "verbose_sub", 0) or 0)
METADATA_VIEW_PREFIX = "statelog_"


# -- commands ------------------------------------------------------------------------------------


def register(commands: Any, command: Any) -> None:
    """Add ``sql``, ``inspect`` and ``restore`` (``command(group, name, handler, help)``)."""
    master_help = "Spark master (default: $STATELOG_SPARK_MASTER or local[*])"
    sql = command(commands, "sql", cmd_sql,
                  "run a Spark SQL query over the state of a checkpoint: one view per operator state "
                  "(<operator>__<state>) and statelog_<table> views of the metadata")
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT key, value FROM counter__count LIMIT 10"')
    sql.add_argument("--checkpoint", default="latest", metavar="ID",
                     help="checkpoint id, latest (default) or savepoint:NAME")
    sql.add_argument("--key-type", metavar="TYPE", default=None,
                     help="Arrow type of the keys (string, int64, ...): a typed key column in every view")
    sql.add_argument("--max-rows", metavar="N", type=_count, default=1000,
                     help="print at most N rows (default 1000)")
    sql.add_argument("--master", default=None, help=master_help)
    inspect = command(commands, "inspect", cmd_inspect,
                      "summarize a checkpoint's operators and states with their row counts (Spark)")
    inspect.add_argument("--checkpoint", default="latest", metavar="ID",
                         help="checkpoint id, latest (default) or savepoint:NAME")
    inspect.add_argument("--no-count", action="store_true", help="skip the row counts (no Spark job)")
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


_READ_ONLY_STARTS = ("SELECT", "WITH", "FROM", "VALUES", "TABLE", "SHOW", "DESCRIBE", "DESC", "EXPLAIN")


def check_read_only(query: str) -> None:
    """``statelog sql`` runs queries only: a statement that would write or change the session
    (INSERT, CREATE, DROP, SET, ...) is refused before Spark starts."""
    text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", query, flags=re.S).lstrip(" \t\r\n(")
    first = re.match(r"[A-Za-z]+", text)
    word = first.group(0).upper() if first else ""
    if word not in _READ_ONLY_STARTS:
        shown = word or (text[:20] or "an empty statement")
        raise ConfigError(
            f"statelog sql runs read-only queries; the statement starts with {shown!r}: use SELECT "
            "(or WITH, SHOW, DESCRIBE, EXPLAIN)"
        )


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Errors raised inside Spark (the data source runs in Python workers) as StatelogError."""
    try:
        yield
    except StatelogError:
        raise
    except Exception as e:  # noqa: BLE001 - py4j/pyspark errors carry our message in their text
        from pyspark.errors import PySparkException

        message = spark_error_message(e)
        if message is None and isinstance(e, PySparkException):  # e.g. a SQL error in the query
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


def _open(root: str, options: Mapping[str, Any]) -> StateJob:
    return StateJob(root, store_options=dict(options) or None, create=False)


def view_names(meta: Any) -> dict[str, tuple[str, str]]:
    """View name -> (operator uid, state) for every state of the checkpoint.

    ``<operator>__<state>`` with every character outside ``[A-Za-z0-9_]`` replaced by ``_``;
    the timer pseudo-states ``__timers_event`` / ``__timers_processing`` become
    ``<operator>__timers_event`` / ``<operator>__timers_processing``. A name taken twice
    gets a suffix ``_2``, ``_3``, ... (in operator, then state order).
    """
    out: dict[str, tuple[str, str]] = {}
    for uid in sorted(meta.operators):
        for state in sorted(meta.operators[uid].states):
            base = f"{_ident(uid)}__{_ident(state.lstrip('_'))}"
            name, n = base, 1
            while name.lower() in (k.lower() for k in out):
                n += 1
                name = f"{base}_{n}"
            out[name] = (uid, state)
    return out


def _ident(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", s) or "_"


def _referenced(query: str, names: Sequence[str]) -> list[str]:
    words = {w.lower() for w in re.findall(r"[A-Za-z0-9_]+", query)}
    return [n for n in names if n.lower() in words]


def register_views(spark: Any, root: str, options: Mapping[str, Any], checkpoint: str,
                   key_type: str | None, only: Sequence[str] | None = None) -> dict[str, tuple[str, str]]:
    """Create the temporary views of a checkpoint (``only``: just these names)."""
    from statelog.spark import METADATA_FORMAT, STATE_FORMAT
    from statelog.spark import options as opt
    from statelog.spark.metadata import TABLES

    job = _open(root, options)
    try:
        meta = opt.resolve(job, checkpoint)
        target = checkpoint if checkpoint.strip().startswith("savepoint:") else str(meta.checkpoint_id)
        root_url = job.root
    finally:
        job.close()
    spark_opts = {"root": root_url, **opt.to_spark_options(options)}
    views = view_names(meta)
    wanted = set(only) if only is not None else None
    for name, (uid, state) in views.items():
        if wanted is not None and name not in wanted:
            continue
        reader = spark.read.format(STATE_FORMAT).options(**spark_opts).option("checkpoint", target)
        reader = reader.option("operator", uid).option("state", state)
        if key_type:
            reader = reader.option("keyType", key_type)
        reader.load().createOrReplaceTempView(name)
    for table in TABLES:
        name = METADATA_VIEW_PREFIX + table
        if wanted is not None and name not in wanted:
            continue
        spark.read.format(METADATA_FORMAT).options(**spark_opts).option("table", table).load() \
            .createOrReplaceTempView(name)
    return views


def cmd_sql(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from statelog.spark import options as opt
    from statelog.spark.metadata import TABLES
    from statelog.spark.schema import parse_key_type

    parse_key_type(args.key_type)
    check_read_only(args.query)
    check_master(args.master)
    job = _open(args.root, options)  # check the root and checkpoint before starting Spark
    try:
        meta = opt.resolve(job, args.checkpoint)
    finally:
        job.close()
    names = [*view_names(meta), *(METADATA_VIEW_PREFIX + t for t in TABLES)]
    used = _referenced(args.query, names)
    with _spark(args.master, _verbosity(args)) as spark, _errors():
        register_views(spark, args.root, options, args.checkpoint, args.key_type, used)
        df = spark.sql(args.query)
        rows = df.limit(args.max_rows + 1).collect()
        columns = df.columns
    truncated = len(rows) > args.max_rows
    rows = rows[: args.max_rows]
    if args.json:
        _json([{c: _plain(r[i]) for i, c in enumerate(columns)} for r in rows])
    else:
        console = _console()
        table = _table(None, *columns)
        for r in rows:
            _row(table, *(_cell(v) for v in r))
        console.print(table)
        console.print(f"{len(rows)} row(s)" + (f" (first {args.max_rows}; use --max-rows)" if truncated else ""))
    return EXIT_OK


def inspect_checkpoint(spark: Any | None, root: str, options: Mapping[str, Any], checkpoint: str) -> dict[str, Any]:
    """Operators and states of a checkpoint, with row counts when ``spark`` is given."""
    from statelog.spark import STATE_FORMAT
    from statelog.spark import options as opt
    from statelog.spark.metadata import Catalog

    job = _open(root, options)
    try:
        cat = Catalog(job, checkpoint)
        meta, sp_name, key = cat.entries[0]
        states = list(cat.states())
        root_url = job.root
    finally:
        job.close()
    views = {v: k for k, v in view_names(meta).items()}
    target = f"savepoint:{sp_name}" if sp_name else str(meta.checkpoint_id)
    out: dict[str, Any] = {
        "root": root_url,
        "checkpoint_id": meta.checkpoint_id,
        "kind": meta.kind,
        "savepoint": sp_name,
        "metadata_key": key,
        "max_parallelism": meta.max_parallelism,
        "sources": meta.sources,
        "operators": [],
    }
    spark_opts = {"root": root_url, **opt.to_spark_options(options)}
    for uid, op in sorted(meta.operators.items()):
        entry: dict[str, Any] = {"uid": uid, "parallelism": op.parallelism, "states": []}
        for row in states:
            if row[3] != uid:
                continue
            name = row[4]
            rows = None
            if spark is not None:
                rows = spark.read.format(STATE_FORMAT).options(**spark_opts).option("checkpoint", target) \
                    .option("operator", uid).option("state", name).load().count()
            entry["states"].append({
                "name": name, "kind": row[5], "value_type": row[6], "user_key_type": row[7], "ttl_ms": row[8],
                "internal": row[10], "view": views[(uid, name)], "rows": rows,
                "changelog_records": row[12], "changelog_bytes": row[13], "materialized_files": row[14],
                "materialized_rows": row[15], "materialized_bytes": row[16],
            })
        out["operators"].append(entry)
    return out


def cmd_inspect(args: argparse.Namespace, options: dict[str, Any]) -> int:
    if args.no_count:
        report = inspect_checkpoint(None, args.root, options, args.checkpoint)
    else:
        with _spark(args.master, _verbosity(args)) as spark, _errors():
            report = inspect_checkpoint(spark, args.root, options, args.checkpoint)
    if args.json:
        _json(report)
        return EXIT_OK
    console = _console()
    what = f"savepoint {report['savepoint']} (checkpoint {report['checkpoint_id']})" if report["savepoint"] \
        else f"checkpoint {report['checkpoint_id']}"
    console.print(f"{what} of {report['root']}: max_parallelism {report['max_parallelism']}, "
                  f"sources {json.dumps(report['sources'], default=str)}", soft_wrap=True)
    for op in report["operators"]:
        table = _table(f"Operator {op['uid']} (parallelism {op['parallelism']})", "state", "kind", "value type",
                       "map key type", "ttl (ms)", "rows", "changelog records", "materialized rows", "view",
                       right=("rows", "changelog records", "materialized rows"))
        for s in op["states"]:
            _row(table, s["name"], s["kind"], s["value_type"], s["user_key_type"], s["ttl_ms"], s["rows"],
                 s["changelog_records"], s["materialized_rows"], s["view"])
        console.print()
        console.print(table)
    return EXIT_OK


def cmd_restore(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from statelog.spark.rescale import parse_renames, prepare, restore

    renames = parse_renames(args.rename_operator)
    job = _open(args.root, options)  # check everything before starting Spark
    try:
        plan = prepare(job, args.checkpoint, parallelism=args.parallelism, savepoint=args.savepoint,
                       drop=args.drop_operator, rename=renames)
    finally:
        job.close()
    with _spark(args.master, _verbosity(args)) as spark, _errors(), _progress(not args.json) as progress:
        result = restore(spark, args.root, args.checkpoint, parallelism=args.parallelism,
                         savepoint=plan.name, drop=args.drop_operator, rename=renames,
                         store_options=options, progress=progress)
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


# -- rendering -----------------------------------------------------------------------------------


def _plain(v: Any) -> Any:
    """A JSON value: bytes as base64 ({"base64": ...}), dates ISO, decimals as strings, rows as objects."""
    if isinstance(v, bytes | bytearray):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if hasattr(v, "asDict"):
        return {k: _plain(x) for k, x in v.asDict().items()}
    if isinstance(v, dict):
        return {str(_plain(k)) if not isinstance(k, str) else k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _cell(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes | bytearray):
        return "0x" + bytes(v).hex()
    if isinstance(v, str):
        return v
    return json.dumps(_plain(v), default=str)


