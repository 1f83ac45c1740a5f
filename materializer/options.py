"""The materializer daemon's options and its trigger policy.

:class:`MaterializerOptions` holds every option of :class:`~materializer.daemon.loop.MaterializerDaemon`
with its default, its range (declared here with the types of :mod:`statelog.options.values`) and a
one-line doc, and, for the
``statelog materializer run`` command, its flag. The daemon, ``start_background``, the
runtime's ``materializer={...}`` and the CLI all build this one object, so an option added
here is accepted (and checked) by all of them. :func:`due` is the policy that decides when a
checkpoint is materialized.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import ClassVar

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import ConfigError
from statelog.materialization.manifest import Manifest
from statelog.options.base import Options, check_bool, option
from statelog.options.engine import RETAIN
from statelog.options.values import DAY, HOUR, MS, Duration, Size, check_port, non_empty_name

# the ranges of the daemon's options (also checked by `statelog materializer run` and `statelog gc`)
MATERIALIZE_INTERVAL = Duration("interval_s", MS, 30 * DAY)
MAX_TAIL_BYTES = Size("max_tail_bytes", 1, 1 << 50)
LEASE_TTL = Duration("lease_ttl_s", 1.0, DAY, hint="the holder renews every third of the ttl, so a shorter one "
                     "only floods the store with lease writes and leaves no time to materialize")
GC_GRACE = Duration("gc_grace_s", 0.0, 365 * DAY)
GC_INTERVAL = Duration("gc_interval_s", MS, 30 * DAY)
POLL = Duration("poll_s", MS, HOUR)

MAX_POLL_S = 5.0  # the default cycle period never exceeds this
MIN_GC_INTERVAL_S = 60.0  # the default GC period: the interval, at least this

# reasons a checkpoint is materialized (the values of the daemon summary's "reason")
REASON_FIRST = "first"  # no materialization exists yet
REASON_TAIL = "tail-size"  # the changelog tail reached max_tail_bytes
REASON_INTERVAL = "interval"  # interval_s passed since the last materialization
REASON_FORCED = "forced"  # run_once(force=True) / BackgroundMaterializer.trigger()

ENGINE_IN_PROCESS = "in-process"
ENGINE_SPARK = "spark"
ENGINES = (ENGINE_IN_PROCESS, ENGINE_SPARK)


def check_engine(label: str, value: object) -> str:
    if value not in ENGINES:
        raise ConfigError(f"{label} must be one of {', '.join(ENGINES)} (where the state tables are written), "
                          f"got {value!r}")
    return str(value)


@dataclass(frozen=True)
class MaterializerOptions(Options):
    """Options of one materializer daemon (``docs/materializer.md`` lists them).

    Fields whose default is ``None`` are derived when unset: ``poll_s`` is
    ``min(5s, interval_s)``, ``gc_interval_s`` is ``max(interval_s, 60s)``, ``owner`` is
    ``daemon@HOST:PID``; ``retain_checkpoints=None`` keeps every checkpoint."""

    KIND: ClassVar[str] = "materializer option"

    interval_s: float = option(60.0, "materialize a newer checkpoint at least this often", MATERIALIZE_INTERVAL,
                               flag="--interval", cli_default="60s")
    max_tail_bytes: int = option(256 << 20, "materialize at once when a checkpoint's changelog tail reaches "
                                 "this size", MAX_TAIL_BYTES, flag="--max-tail-bytes", cli_default="256MB")
    lease_ttl_s: float = option(30.0, "leader lease ttl: a standby takes over about this long after the holder "
                                "died", LEASE_TTL, flag="--lease-ttl", cli_default="30s")
    gc_grace_s: float = option(600.0, "GC deletes unreferenced objects only when older than this", GC_GRACE,
                               flag="--gc-grace", cli_default="10m")
    retain_checkpoints: int | None = option(None, "GC also deletes all but the newest N checkpoints",
                                            RETAIN, flag="--retain", cli_default_text="keep them all")
    poll_s: float | None = option(None, "how often to look for due checkpoints", POLL,
                                  flag="--poll", cli_default_text="the interval, at most 5s")
    gc_interval_s: float | None = option(None, "how often GC runs without a new materialization",
                                         GC_INTERVAL, flag="--gc-interval",
                                         cli_default_text="the interval, at least 60s")
    owner: str | None = option(None, "name of this daemon in the lease, not empty", non_empty_name,
                               flag="--owner", cli_default_text="daemon@HOST:PID")
    run_gc: bool = option(True, "collect garbage after each publication and every gc_interval_s", check_bool,
                          flag="--no-gc", flag_help="do not collect garbage")
    metrics_port: int | None = option(None, "serve Prometheus metrics at /metrics and a health probe at /healthz "
                                      "on this TCP port (0: any free port)", check_port, flag="--metrics-port",
                                      cli_default_text="off", metavar="PORT")
    engine: str = option(ENGINE_IN_PROCESS, "where the state tables are written: in-process, or spark (one Spark "
                         "task per key-group unit; needs the spark extra)", check_engine, flag="--engine",
                         cli_default=ENGINE_IN_PROCESS, metavar="ENGINE")
    spark_master: str | None = option(None, "the Spark master of engine spark", non_empty_name,
                                      flag="--spark-master", cli_default_text="$STATELOG_SPARK_MASTER or local[*]",
                                      metavar="URL")
    metrics_host: str = option("127.0.0.1", "address the metrics port listens on", non_empty_name,
                               flag="--metrics-host", cli_default="127.0.0.1", metavar="ADDR")

    @property
    def cycle_s(self) -> float:
        """The cycle period of :meth:`MaterializerDaemon.run`."""
        return self.poll_s if self.poll_s is not None else min(MAX_POLL_S, self.interval_s)

    @property
    def gc_every_s(self) -> float:
        return self.gc_interval_s if self.gc_interval_s is not None else max(self.interval_s, MIN_GC_INTERVAL_S)


def default_owner(kind: str = "daemon") -> str:
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def due(
    latest_checkpoint: CheckpointMetadata | None,
    latest_manifest: Manifest | None,
    now: float,
    last_materialized_at: float | None,
    interval_s: float,
    max_tail_bytes: int,
) -> str | None:
    """The trigger policy: why ``latest_checkpoint`` should be materialized now, or ``None``.

    A checkpoint is due only if it is newer than ``latest_manifest`` (the newest published
    materialization) and has a changelog tail (``changelog_bytes`` > 0: a checkpoint without
    one holds exactly the state of its base, which is materialized already). Then it is due
    when there is no materialization yet (``"first"``), when its tail reached
    ``max_tail_bytes`` (``"tail-size"``), or when ``interval_s`` passed since the last
    materialization (``"interval"``). ``now`` and ``last_materialized_at`` are wall-clock
    seconds; without ``last_materialized_at`` the manifest's ``created_ms`` is used.
    """
    if latest_checkpoint is None:
        return None
    if latest_manifest is not None and latest_checkpoint.checkpoint_id <= latest_manifest.checkpoint_id:
        return None
    tail = latest_checkpoint.changelog_bytes
    if tail <= 0:
        return None
    if latest_manifest is None:
        return REASON_FIRST
    if tail >= max_tail_bytes:
        return REASON_TAIL
    since = last_materialized_at if last_materialized_at is not None else latest_manifest.created_ms / 1000
    if now - since >= interval_s:
        return REASON_INTERVAL
    return None
