"""The materializer daemon's loop: cycles under the leader lease until stopped.

:class:`MaterializerDaemon` watches one job root. Each cycle (:meth:`~MaterializerDaemon.run_once`,
the steps in :mod:`materializer.daemon`) holds the lease (:mod:`~materializer.daemon.fencing`),
materializes a due checkpoint (:mod:`~materializer.daemon.publish`) and collects garbage when
it is due (:mod:`~materializer.daemon.gc_schedule`). :meth:`~MaterializerDaemon.run` loops
over cycles until stopped (sleeping in short steps so a stop request is served promptly, also
in the middle of a materialization, which is then abandoned: its files are unreachable
leftovers that GC removes after the grace period), serves forced cycles
(:meth:`~MaterializerDaemon.request_cycle`), retries failed ones with backoff, ends with the
:class:`~statelog.errors.FencedError` of a lost lease, and releases the lease on the way out,
so a standby takes over at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from materializer.build import MaterializeOptions, TableEngine
from materializer.daemon.fencing import LeaseHolding
from materializer.daemon.gc_schedule import GcSchedule
from materializer.daemon.metrics import DaemonMetrics
from materializer.daemon.publish import Progress, Publisher, Stopped
from materializer.daemon.status import StatusWriter
from materializer.lease import LeaderLease
from materializer.options import ENGINE_SPARK, MaterializerOptions, default_owner
from statelog.checkpoint.catalog import JobCatalog
from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    FencedError,
    StatelogError,
    StorePermissionError,
)
from statelog.store.base import ObjectStore

if TYPE_CHECKING:  # prometheus_client: loads when the metrics are served
    from statelog.metrics import MetricsServer

log = logging.getLogger(__name__)

# store errors that retrying cannot fix: the daemon stops on them (exit non-zero) instead of
# looping; transient ones (timeouts, 5xx, resets) are retried with backoff
FATAL_ERRORS = (StorePermissionError, AuthenticationError, BucketNotFoundError)

_STEP_S = 0.05  # sleeping granularity: how promptly a stop or trigger is noticed
_MAX_BACKOFF_S = 60.0


class _OnceLimit:
    """How long ``run(once=True)`` keeps trying while another daemon holds the lease: about one
    lease ttl (an abandoned lease is taken over after one ttl, the *holder's*), but no longer
    once it sees the holder renew."""

    def __init__(self, lease: LeaderLease) -> None:
        self.lease = lease
        self.started = time.monotonic()
        self.give_up = self.started + lease.ttl_s + lease.renew_interval_s
        self.first_holder: tuple[Any, ...] | None = None

    def done(self, last: dict[str, Any]) -> bool:
        if last["leader"] or last["action"] == "fenced":
            return True
        holder = last.get("holder") or {}
        state = (holder.get("generation"), holder.get("renewals"), holder.get("released"))
        if self.first_holder is None:
            self.first_holder = state
            # taking over an abandoned lease takes the *holder's* ttl, not ours
            holder_ttl = (holder.get("ttl_ms") or 0) / 1000.0
            self.give_up = max(self.give_up, self.started + holder_ttl + self.lease.renew_interval_s)
            return False
        # the holder is alive (it renewed) or we waited long enough
        return state != self.first_holder or time.monotonic() >= self.give_up


class MaterializerDaemon:
    """Materializes the checkpoints of one job root while holding its leader lease.

    ``store``: the job root (the caller owns and closes it). ``options``: a
    :class:`~materializer.options.MaterializerOptions` (defaults, ranges and docs of every
    option: the triggers ``interval_s`` and ``max_tail_bytes`` (see :func:`due`), the lease
    ttl, GC, the cycle period, the owner), or the same options as keyword arguments. ``layout``:
    the state tables' layout (:class:`MaterializeOptions`). ``clock`` is the wall clock
    (seconds) of the interval trigger and of GC; ``lease_clock`` measures the lease's
    intervals (default :func:`time.monotonic`, or ``clock`` when a clock is injected).
    ``progress(what, done, total)`` is called with the cycle's phases and the
    materialization's progress. ``table_engine`` writes the tables (default: per the ``engine``
    option, in this process or, for ``"spark"``, a :class:`~materializer.spark.SparkEngine`
    on ``store.url`` opened with ``store_options``, started at the first materialization).
    """

    def __init__(
        self,
        store: ObjectStore,
        options: MaterializerOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
        progress: Progress | None = None,
        layout: MaterializeOptions | None = None,
        lease_clock: Callable[[], float] | None = None,
        table_engine: TableEngine | None = None,
        store_options: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        settings = MaterializerOptions.from_mapping(overrides)  # unknown names and ranges: one place
        if options is not None:
            settings = dataclasses.replace(options, **overrides)
        self.settings = settings
        self.interval_s = settings.interval_s
        self.max_tail_bytes = settings.max_tail_bytes
        self.gc_grace_s = settings.gc_grace_s
        self.retain_checkpoints = settings.retain_checkpoints
        self.poll_s = settings.cycle_s
        self.gc_interval_s = settings.gc_every_s
        self.run_gc = settings.run_gc
        self.store = store
        self.catalog = JobCatalog(store)
        self.owner = default_owner() if settings.owner is None else settings.owner
        self.clock = clock
        self.progress = progress
        self.layout = layout
        if table_engine is None and settings.engine == ENGINE_SPARK:
            from materializer.spark import SparkEngine  # its session starts at first use

            table_engine = SparkEngine(store.url, store_options, master=settings.spark_master)
        self.engine = table_engine
        if lease_clock is None:
            lease_clock = time.monotonic if clock is time.time else clock
        self.lease = LeaderLease(store, self.owner, settings.lease_ttl_s, clock=lease_clock)
        # the fencing margin: the lease must stay valid this long after the check (the publish)
        self.publish_margin_s = self.lease.ttl_s / 6
        self.holding = LeaseHolding(store, self.lease, self.owner)
        self.publisher = Publisher(store, self.catalog, self.lease, clock, self._emit, self._stopping,
                                   self.publish_margin_s)  # fmt: skip
        self.gc = GcSchedule(store, self.lease, clock, self._emit, self.publish_margin_s)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._requested = 0  # forced cycles requested (request_cycle), ...
        self._served = 0  # ... and the newest request a completed cycle served
        # (summary, error) of the newest forced cycle
        self.forced_result: tuple[dict[str, Any] | None, BaseException | None] = (None, None)
        self._busy = False
        self._stop_events: tuple[threading.Event, ...] = (self._stop,)
        self.on_cycle: Callable[[dict[str, Any]], None] | None = None  # called by run() after each cycle
        self.last_summary: dict[str, Any] | None = None
        self.last_error: BaseException | None = None
        self.status = StatusWriter(self.store, self.owner)  # materializer/status/: last cycle, last error
        self.cycles = 0
        self.metrics = DaemonMetrics(self)  # served by run() when metrics_port is set
        self.metrics_server: MetricsServer | None = None

    def __repr__(self) -> str:
        return f"MaterializerDaemon({self.store.url!r}, owner={self.owner!r}, generation={self.lease.generation})"

    @property
    def published(self) -> int:
        """Materializations this daemon published."""
        return self.publisher.published

    # -- one cycle ----------------------------------------------------------------------------

    def _emit(self, what: str, done: int = 0, total: int = 0) -> None:
        if self.progress is not None:
            self.progress(what, done, total)

    def _stopping(self) -> bool:
        return any(e.is_set() for e in self._stop_events)

    def lost_error(self) -> FencedError | None:
        """The error that ends :meth:`run` for good once this daemon lost a lease it held
        (expired in a stall longer than the ttl, or taken over), else ``None``."""
        return self.holding.lost_error()

    def run_once(self, force: bool = False) -> dict[str, Any]:
        """One cycle (see :mod:`materializer.daemon`); returns its summary as plain data.

        Keys: ``owner``, ``leader``, ``generation`` (the held one, or ``None``), ``holder``
        (standby only: the lease holder as :func:`~materializer.lease.current_holder`
        describes it), ``action`` (``"standby"``, ``"none"``, ``"materialized"`` or
        ``"fenced"``), ``reason`` (why it materialized, or why not), ``latest_checkpoint``,
        ``latest_materialization`` (before the cycle), ``materialization`` (what this cycle
        published), ``gc`` (the GC report, ``None`` if GC did not run) and ``duration_s``.
        Store errors propagate (:meth:`run` logs them and retries).
        """
        t0 = time.monotonic()
        summary: dict[str, Any] = {
            "root": self.store.url,
            "owner": self.owner,
            "leader": False,
            "generation": None,
            "holder": None,
            "action": "standby",
            "reason": None,
            "latest_checkpoint": None,
            "latest_materialization": None,
            "materialization": None,
            "gc": None,
            "duration_s": 0.0,
        }
        error: BaseException | None = None
        try:
            self._cycle(summary, force)
        except BaseException as exc:
            error = exc
            raise
        finally:
            summary["duration_s"] = round(time.monotonic() - t0, 3)
            self.cycles += 1
            self.last_summary = summary
            self.status.cycle_done(self.cycles, summary, error)  # never raises
        return summary

    def _cycle(self, summary: dict[str, Any], force: bool) -> None:
        self._emit("lease")
        if not self.holding.ensure():
            self.holding.standby(summary)
            return
        generation = self.holding.lead()
        summary.update(leader=True, generation=generation, action="none")
        meta, reason = self.publisher.plan(summary, force, self.interval_s, self.max_tail_bytes)
        published = False
        if reason is not None:
            assert meta is not None
            published = self.publisher.publish(meta, generation, reason, summary, self.layout, self.engine)
        gc_due = self.gc.due(published, self.gc_interval_s)
        if self.run_gc and summary["action"] != "fenced" and gc_due:
            summary["gc"] = self.gc.collect(self.retain_checkpoints, self.gc_grace_s)

    # -- the loop -----------------------------------------------------------------------------

    def request_cycle(self) -> int:
        """Ask :meth:`run` for a forced cycle soon; returns a ticket for :meth:`wait_served`."""
        with self._cond:
            self._requested += 1
            ticket = self._requested
        self._wake.set()
        return ticket

    def wait_served(self, ticket: int, timeout: float | None = None) -> bool:
        """Wait until a cycle that started after request ``ticket`` completed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._served >= ticket or self._stopping(), timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every requested cycle was served and no cycle runs."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (self._served >= self._requested and not self._busy) or self._stopping(), timeout
            )

    def stop(self) -> None:
        """Ask :meth:`run` to return (promptly: a running materialization is abandoned)."""
        self._stop.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stopping():
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            if self._wake.wait(min(_STEP_S, remaining)):
                self._wake.clear()
                return

    def run(self, stop_event: threading.Event | None = None, once: bool = False) -> dict[str, Any] | None:
        """Run cycles until ``stop_event`` (or :meth:`stop`) is set; release the lease at the end.

        With ``once`` a single cycle runs; if another daemon's lease is in the way, it keeps
        trying for about one lease ttl (an abandoned lease is taken over after one ttl) but
        gives up as soon as it sees the holder renew. Errors of a cycle are logged and the
        cycle is retried with backoff (with ``once`` they propagate); errors that retrying
        cannot fix (:data:`FATAL_ERRORS`: no permission, refused credentials, no bucket,
        e.g. a root this daemon may read but not write) propagate at once. Returns the last
        cycle's summary.
        """
        self._stop_events = (self._stop,) if stop_event is None else (self._stop, stop_event)
        log.info(
            "materializer %s on %s: interval %gs, max tail %d bytes, lease ttl %gs, gc grace %gs%s",
            self.owner, self.store.url, self.interval_s, self.max_tail_bytes, self.lease.ttl_s,
            self.gc_grace_s, "" if self.run_gc else " (gc off)",
        )
        last: dict[str, Any] | None = None
        failures = 0
        if self.settings.metrics_port is not None and self.metrics_server is None:
            self.metrics_server = self.metrics.serve(self.health, self.settings.metrics_host, self.settings.metrics_port)
        limit = _OnceLimit(self.lease)
        try:
            while not self._stopping():
                with self._cond:  # the requests up to this ticket are served by this (forced) cycle
                    ticket = self._requested
                    force = ticket > self._served
                    self._busy = True
                error: BaseException | None = None
                cycle: dict[str, Any] | None = None
                try:
                    last = cycle = self.run_once(force=force)
                    failures = 0
                    self.metrics.observe_cycle(last)
                    if self.on_cycle is not None:
                        self.on_cycle(last)
                except Stopped:
                    log.info("stop requested: abandoned the running materialization")
                    break
                except Exception as exc:
                    if once or isinstance(exc, FATAL_ERRORS):
                        raise
                    error = exc
                    failures += 1
                    self.metrics.observe_failure(exc)
                    if isinstance(exc, StatelogError):
                        log.error("materializer cycle failed: %s", exc)
                    else:
                        log.exception("materializer cycle failed unexpectedly")
                finally:
                    with self._cond:
                        self._busy = False
                        self._served = max(self._served, ticket)
                        self.last_error = error
                        if force:  # what trigger() returns: later unforced cycles do not replace it
                            self.forced_result = (cycle, error)
                        self._cond.notify_all()
                lost = None if once else self.lost_error()
                if lost is not None:  # the caller reports it (the CLI: one line)
                    raise lost
                if once:
                    assert last is not None
                    if limit.done(last):
                        return last
                if failures:
                    self._sleep(min(_MAX_BACKOFF_S, self.poll_s * 2 ** min(failures, 10)))
                else:
                    self._sleep(min(self.poll_s, self.lease.renew_interval_s))
        finally:
            self.release()
            close = getattr(self.engine, "close", None)
            if close is not None:  # a Spark session the engine started
                close()
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None
            with self._cond:
                self._cond.notify_all()
        return last

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: healthy while cycles succeed (leader or standby); the last error if not."""
        s = self.last_summary or {}
        details = {"owner": self.owner, "leader": bool(s.get("leader")), "cycles": self.cycles,
                   "materializations": self.published}  # fmt: skip
        if self._stopping():
            return False, {**details, "reason": "stopping"}
        if self.last_error is not None:
            return False, {**details, "reason": f"the last cycle failed: {type(self.last_error).__name__}: "
                                                f"{self.last_error}"}  # fmt: skip
        return True, details

    def release(self) -> None:
        """Give the lease up (on clean shutdown) so that a standby takes over at once."""
        self.holding.release()
