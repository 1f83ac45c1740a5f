"""The SparkSession of one ``statelog`` command (``sql``/``inspect``/``restore`` with Spark,
``materializer run --engine spark``).

* :func:`session`: a local SparkSession for the command, started quietly (the JVM's console
  output goes to a log file unless ``-v``); a JVM that does not start is one error line with
  the reason from its log. An active session of the caller is reused, not stopped.
* :func:`check_master`: the ``--master`` values Spark knows, checked before anything starts.
* :func:`one_line_errors`: errors raised inside Spark (the data source runs in Python
  workers) become one :class:`StatelogError` line.

PySpark is the ``spark`` extra: :mod:`statelog.spark` and PySpark are imported only inside
these functions, so the other commands work without them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from statelog import errors as statelog_errors
from statelog.errors import ConfigError, StatelogError
from tools.sql.views import ViewPlan, unknown_view


def verbosity(args: argparse.Namespace) -> int:
    """``-v`` given before and after the command, added."""
    return int(getattr(args, "verbose", 0) or 0) + int(getattr(args, "verbose_sub", 0) or 0)


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
def session(master: str | None, verbose: int = 0) -> Iterator[Any]:
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
def one_line_errors(plan: ViewPlan | None = None) -> Iterator[None]:
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
