"""``statelog materializer ...``: the materializer daemon (see ``docs/cli.md``, ``docs/materializer.md``).

``materializer run ROOT`` runs :class:`materializer.daemon.loop.MaterializerDaemon` in the
foreground until SIGTERM or SIGINT (or for one cycle with ``--once``); it is the only
command that writes to a job root (materializations, lease objects, garbage collection).
``materializer status ROOT`` shows the lease holder and the newest materialization.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from materializer.daemon.loop import MaterializerDaemon
from materializer.daemon.report import manifest_summary
from materializer.lease import current_holder
from materializer.options import ENGINE_SPARK, MaterializerOptions
from statelog.checkpoint.catalog import JobCatalog
from statelog.errors import ConfigError
from statelog.materialization.manifest import latest_manifest_key, load_manifest
from statelog.options.base import check_bool
from statelog.options.values import Count, Duration, Size
from statelog.signals import stop_on_signals
from statelog.store import open_store
from tools.cli import output, spark_session
from tools.roots import open_root

log = logging.getLogger("tools.cli")

EXIT_OK = 0

# -- value parsing -------------------------------------------------------------------------------
# The values and ranges of the options are checked by MaterializerOptions (one place for the
# library and the CLI); a bad value is a ConfigError, printed as one line with exit code 2.


# flags that apply only together with another: field -> (what it applies with, how to add that,
# whether the parsed arguments have it). These fields have no argparse default (None: not given;
# MaterializerOptions supplies the default), so that a flag given in vain is refused.
_GC = ("garbage collection, which --no-gc turns off", "drop --no-gc", lambda a: a.run_gc)
_APPLIES_ONLY_WITH: dict[str, tuple[str, str, Any]] = {
    "spark_master": ("--engine spark", "add --engine spark", lambda a: a.engine == ENGINE_SPARK),
    "metrics_host": ("--metrics-port", "add --metrics-port PORT", lambda a: a.metrics_port is not None),
    "gc_grace_s": _GC,
    "gc_interval_s": _GC,
    "retain_checkpoints": _GC,
}


def _check_combinations(args: argparse.Namespace) -> None:
    """A flag that has no effect without another is refused (it was likely meant to have one)."""
    fields = MaterializerOptions.field_map()
    for name, (what, fix, present) in _APPLIES_ONLY_WITH.items():
        if getattr(args, name) is not None and not present(args):
            flag = fields[name].metadata["flag"]
            raise ConfigError(f"{flag} applies only with {what}; drop {flag}, or {fix}")


def _check_run_options(args: argparse.Namespace) -> MaterializerOptions:
    """The ``materializer run`` options (one flag per :class:`MaterializerOptions` field),
    each checked against its range and named by its flag in errors; a flag that applies only
    with another is refused without it (:data:`_APPLIES_ONLY_WITH`)."""
    _check_combinations(args)
    values: dict[str, Any] = {}
    for name, f in MaterializerOptions.field_map().items():
        value = getattr(args, name)
        if value is not None:  # a switch's value is a bool already
            values[name] = MaterializerOptions.check_field(name, value, f.metadata["flag"])
    return MaterializerOptions(**values)


def _add_run_flags(run: argparse.ArgumentParser) -> None:
    """One flag per :class:`MaterializerOptions` field: its doc, default and range."""
    for name, f in MaterializerOptions.field_map().items():
        flag, check = f.metadata["flag"], f.metadata["check"]
        if check is check_bool:  # a switch that turns a default-on option off (--no-gc)
            run.add_argument(flag, dest=name, action="store_false", default=True, help=f.metadata["flag_help"])
            continue
        cli_default = f.metadata.get("cli_default")
        metavar = f.metadata.get("metavar") or {Duration: "DURATION", Size: "SIZE", Count: "N"}.get(
            type(check), "NAME"
        )
        extra = []
        default_text = cli_default if cli_default is not None else f.metadata.get("cli_default_text")
        if default_text is not None:
            extra.append(f"default {default_text}")
        if isinstance(check, Size):
            extra.append("binary units")
        if hasattr(check, "range"):
            extra.append(check.range)
        doc = f.metadata["doc"] + (f" ({'; '.join(extra)})" if extra else "")
        default = None if name in _APPLIES_ONLY_WITH else cli_default  # None: not given (the field's default)
        run.add_argument(flag, dest=name, default=default, metavar=metavar, help=doc)


# -- commands ------------------------------------------------------------------------------------


def declare_run(run: argparse.ArgumentParser) -> None:
    """The arguments of ``materializer run`` (its commands are in :mod:`tools.cli.commands`)."""
    run.add_argument("--once", action="store_true", help="run one cycle and exit")
    _add_run_flags(run)


class _TerminalView:
    """A transient ``rich`` progress line on stderr: the cycle's phase and materialization progress."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False, markup=False)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            console=self.console,
            transient=True,
        )
        self.task: Any = None
        self._rerouted: list[tuple[logging.StreamHandler, Any]] = []
        self.idle = "starting"

    def __enter__(self) -> _TerminalView:
        original = sys.stderr
        self.progress.start()
        self.task = self.progress.add_task(self.idle, total=None)
        # log lines go through rich's stderr proxy so that they print above the progress line
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is original and sys.stderr is not original:
                self._rerouted.append((h, h.setStream(sys.stderr)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h, stream in self._rerouted:
            h.setStream(stream)
        self.progress.stop()

    def update(self, what: str, done: int, total: int) -> None:
        self.progress.update(self.task, description=what, completed=done, total=total or None)

    def cycle(self, s: dict[str, Any]) -> None:
        if s["leader"]:
            parts = [f"leader (lease generation {s['generation']})"]
            chk = s["latest_checkpoint"]
            parts.append(f"latest checkpoint {chk['id']}" if chk else "no checkpoint yet")
            mat = s["materialization"] or s["latest_materialization"]
            if mat:
                age = 0.0 if s["materialization"] else mat["age_s"]
                parts.append(f"materialized checkpoint {mat['checkpoint_id']} {age:.0f}s ago")
        else:
            h = s.get("holder") or {}
            parts = [f"standby: lease generation {h.get('generation', '?')} held by {h.get('owner', '?')}"]
        self.progress.update(self.task, description=" · ".join(parts), completed=0, total=None)


def _summary_line(s: dict[str, Any]) -> str:
    if not s["leader"]:
        h = s.get("holder") or {}
        who = f"generation {h['generation']} held by {h['owner']}" if h else "not held"
        return f"{s['root']}: standby ({s['action']}): {s['reason']}; lease {who}"
    if s["action"] == "materialized":
        m = s["materialization"]
        return (
            f"{s['root']}: materialized checkpoint {m['checkpoint_id']} ({s['reason']}) as {m['id']}: "
            f"{m['rows']} rows, {m['files']} files, {output.human_bytes(m['bytes'])} "
            f"(lease generation {s['generation']}, {s['duration_s']:.2f}s)"
        )
    return f"{s['root']}: nothing to do: {s['reason']} (lease generation {s['generation']})"


def cmd_run(args: argparse.Namespace, options: dict[str, Any]) -> int:
    daemon_options = _check_run_options(args)  # before the store is opened: a usage error
    if daemon_options.engine != ENGINE_SPARK:
        return _run(args, options, daemon_options, None)
    import statelog.spark  # noqa: F401 - without PySpark: the MissingDependencyError naming the extra
    try:
        spark_session.check_master(daemon_options.spark_master)
    except ConfigError as e:  # the same check, named by this command's flag
        raise ConfigError(str(e).replace("--master:", "--spark-master:", 1)) from None
    with spark_session.session(daemon_options.spark_master, spark_session.verbosity(args)) as spark:
        from materializer.spark import SparkEngine

        return _run(args, options, daemon_options, SparkEngine(args.root, options, spark=spark))


def _run(args: argparse.Namespace, options: dict[str, Any], daemon_options: MaterializerOptions,
         engine: Any) -> int:
    stop = threading.Event()
    store = open_store(args.root, options)
    try:
        JobCatalog(store).open_job(None, create=False)  # never create a job root here
        daemon = MaterializerDaemon(store, daemon_options, table_engine=engine, store_options=options)
        view = _TerminalView() if sys.stderr.isatty() else None
        if view is not None:
            daemon.progress = view.update
        previous: list[tuple[Any, Any]] = []

        def on_cycle(s: dict[str, Any]) -> None:
            if view is not None:
                view.cycle(s)
            if args.json and not args.once:  # one JSON line per event worth reporting
                key = (s["leader"], s["generation"])
                if s["action"] in ("materialized", "fenced") or previous[-1:] != [key]:
                    sys.stdout.write(json.dumps(s, default=str) + "\n")
                    sys.stdout.flush()
                previous[:] = [key]

        daemon.on_cycle = on_cycle
        with stop_on_signals(stop, logger=log), \
                (view if view is not None else contextlib.nullcontext()):
            last = daemon.run(stop, once=args.once)
    finally:
        store.close()
    if args.once:
        if last is None:  # stopped before the cycle ran
            return EXIT_OK
        if args.json:
            output._json(last)
        else:
            output._console().print(_summary_line(last), soft_wrap=True)
    else:
        log.info("stopped after %d cycle(s), %d materialization(s) published", daemon.cycles, daemon.published)
    return EXIT_OK


# -- status --------------------------------------------------------------------------------------


def materializer_status(store: Any, now: float | None = None) -> dict[str, Any]:
    """The lease holder, the newest materialization and the newest checkpoint of a job root."""
    now = time.time() if now is None else now
    catalog = JobCatalog(store)
    catalog.open_job(None, create=False)
    holder = current_holder(store)
    if holder is not None:
        idle = max(0.0, now - holder["last_activity_mtime"])
        holder = dict(holder, last_activity_age_s=round(idle, 3))
        if holder["released"]:
            holder["state"] = "released"
        elif idle > holder["ttl_ms"] / 1000:
            holder["state"] = "stale"  # no renewal for longer than the ttl: likely dead
        else:
            holder["state"] = "held"
    key = latest_manifest_key(store)
    mat = manifest_summary(load_manifest(store, key), now) if key else None
    latest = catalog.latest()
    chk = None
    if latest is not None:
        chk = {
            "id": latest.checkpoint_id,
            "timestamp_ms": latest.timestamp_ms,
            "tail_bytes": latest.changelog_bytes,
            "materialized": mat is not None and mat["checkpoint_id"] >= latest.checkpoint_id,
        }
    return {"root": store.url, "lease": holder, "latest_materialization": mat, "latest_checkpoint": chk}


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def cmd_status(args: argparse.Namespace, options: dict[str, Any]) -> int:
    with open_root(args.root, options) as root:
        status = materializer_status(root.catalog.store)
    if args.json:
        output._json(status)
        return EXIT_OK
    console = output._console()
    table = output._table(f"Materializer of {status['root']}", "field", "value")
    lease = status["lease"]
    if lease is None:
        output._row(table, "lease", "never acquired (no daemon has run on this root)")
    else:
        output._row(table, "lease", f"generation {lease['generation']}, {lease['state']}")
        output._row(table, "holder", f"{lease['owner']} (host {lease['host']}, pid {lease['pid']})")
        output._row(table, "acquired (UTC)", output.iso_utc(lease["acquired_ms"]) if lease["acquired_ms"] else None)
        output._row(table, "ttl", f"{lease['ttl_ms'] / 1000:g}s")
        output._row(table, "last lease activity", f"{_age(lease['last_activity_age_s'])} ago ({lease['renewals']} renewal(s) of this generation)")
        if lease["state"] == "held":
            output._row(table, "expires (UTC, hint)", output.iso_utc(lease["expires_hint_ms"]))
    mat = status["latest_materialization"]
    if mat is None:
        output._row(table, "materialization", "none yet")
    else:
        output._row(table, "materialization", f"{mat['id']} (checkpoint {mat['checkpoint_id']})")
        output._row(table, "rows / files", f"{mat['rows']} rows in {mat['files']} files of {output.human_bytes(mat['bytes'])}")
        output._row(table, "published", f"{_age(mat['age_s'])} ago by lease generation {mat['lease_generation']}")
    chk = status["latest_checkpoint"]
    if chk is None:
        output._row(table, "latest checkpoint", "none yet")
    else:
        state = "materialized" if chk["materialized"] else f"changelog tail {output.human_bytes(chk['tail_bytes'])}"
        output._row(table, "latest checkpoint", f"{chk['id']} ({state})")
    console.print(table)
    return EXIT_OK
