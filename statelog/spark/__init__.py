"""Spark over statelog job roots: SQL on keyed state, the change feed, metadata, restore jobs.

::

    import statelog.spark
    spark = statelog.spark.session()          # or your own SparkSession, then:
    statelog.spark.register(spark)            # format("statelog") and format("statelog-metadata")
    df = (spark.read.format("statelog").option("root", ROOT).option("operator", "counter")
          .option("state", "count").load())

The data sources are PySpark Python data sources: the Python workers read the objects
through statelog's own store layer (``file://`` and ``s3://``; pass store options as
``store.<name>`` options). Usage, options and schemas: docs/spark.md.

PySpark is an optional dependency (the ``spark`` extra): without it, importing this package
raises :class:`~statelog.errors.MissingDependencyError`, which says how to install it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from statelog.errors import MissingDependencyError

try:
    from pyspark.sql import SparkSession
except ImportError as e:
    raise MissingDependencyError(
        f"statelog.spark needs PySpark, which cannot be imported ({e}); install the spark extra: "
        "pip install 'statelog[spark]' (Spark also needs Java 17 or newer)"
    ) from None

from statelog.readers.options import to_spark_options  # noqa: E402
from statelog.spark.datasource import StatelogDataSource  # noqa: E402 - after the PySpark check
from statelog.spark.metadata import StatelogMetadataDataSource  # noqa: E402

STATE_FORMAT = "statelog"
METADATA_FORMAT = "statelog-metadata"

_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.python.worker.reuse": "true",
}


def register(spark: SparkSession) -> SparkSession:
    """Register ``format("statelog")`` and ``format("statelog-metadata")`` on ``spark``."""
    spark.dataSource.register(StatelogDataSource)
    spark.dataSource.register(StatelogMetadataDataSource)
    return spark


def session(
    master: str | None = None,
    app_name: str = "statelog",
    conf: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A (local) SparkSession with the statelog data sources registered.

    ``master`` defaults to ``$STATELOG_SPARK_MASTER`` or ``local[*]``. The Python workers
    run the current interpreter (``PYSPARK_PYTHON``, unless already set), so they import
    the same statelog. The web UI and Spark's console progress bar are off.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master or os.environ.get("STATELOG_SPARK_MASTER", "local[*]"))
    builder = builder.appName(app_name)
    for k, v in {**_DEFAULT_CONF, **dict(conf or {})}.items():
        builder = builder.config(k, str(v))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return register(spark)


def read_state(spark: SparkSession, root: str, operator: str, state: str, *, checkpoint: str | int = "latest",
               store_options: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """``spark.read.format("statelog")`` with the given options (a convenience)."""
    reader = spark.read.format(STATE_FORMAT).option("root", root).option("operator", operator)
    reader = reader.option("state", state).option("checkpoint", str(checkpoint))
    for k, v in {**to_spark_options(store_options), **{k: str(v) for k, v in options.items()}}.items():
        reader = reader.option(k, v)
    return reader.load()


__all__ = ["METADATA_FORMAT", "STATE_FORMAT", "read_state", "register", "session"]
