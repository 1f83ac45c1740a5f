"""The materializer daemon: materialize due checkpoints under a leader lease, then collect garbage.

One :class:`MaterializerDaemon` watches one job root. Every cycle (:meth:`~MaterializerDaemon.run_once`)

1. makes sure it holds the leader lease (:class:`~materializer.lease.LeaderLease`): acquire
   it if free, renew it when a third of its ttl has passed; a daemon that is not the holder
   (a *standby*) does nothing else and tries again next cycle;
2. loads the newest completed checkpoint and the newest published materialization and asks
   the trigger policy :func:`due` whether the checkpoint must be materialized now: it is
   newer than the materialization and its changelog tail (the bytes after its base) reached
   ``max_tail_bytes``, or ``interval_s`` passed since the last materialization, or there is
   no materialization yet (or the cycle is forced);
3. materializes it (:class:`~materializer.build.Materializer`) with the lease generation
   as fencing token. While it runs, a keeper thread renews the lease; right before the
   manifest is written the lease is checked again (``before_publish``) with a margin that
   covers the write, so a daemon whose lease expired or was taken over never publishes;
4. runs garbage collection (:func:`materializer.gc.collect_garbage`) after a publication and
   otherwise every ``gc_interval_s``, while it still holds the lease.

:meth:`~MaterializerDaemon.run` loops over cycles until stopped (sleeping in short steps so a
stop request is served promptly, also in the middle of a materialization, which is then
abandoned: its files are unreachable leftovers that GC removes after the grace period) and
releases the lease on the way out, so a standby takes over at once.

:mod:`materializer.background` runs the same loop in a daemon thread of the current process
(``start_background``): the embedded default for single-process jobs, examples and tests.
See ``docs/materializer.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from materializer.build import MaterializeOptions, Materializer, TableEngine
from materializer.gc import collect_garbage
from materializer.lease import LeaderLease, LeaseKeeper, current_holder
from materializer.metrics import DaemonMetrics
from materializer.options import (
    ENGINE_SPARK,
    REASON_FORCED,
    MaterializerOptions,
    default_owner,
    due,
)
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    CheckpointNotFoundError,
    FencedError,
    LeaseLostError,
    StatelogError,
    StorePermissionError,
)
from statelog.materialization.manifest import Manifest, latest_manifest_key, load_manifest
from statelog.metrics import MetricsServer
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

# store errors that retrying cannot fix: the daemon stops on them (exit non-zero) instead of
# looping; transient ones (timeouts, 5xx, resets) are retried with backoff
FATAL_ERRORS = (StorePermissionError, AuthenticationError, BucketNotFoundError)

Progress = Callable[[str, int, int], None]  # (what, done, total), as in materializer.build

_STEP_S = 0.05  # sleeping granularity: how promptly a stop or trigger is noticed
_MAX_BACKOFF_S = 60.0


class _Stopped(Exception):
    """Raised from the progress hook to abandon a materialization when a stop is requested."""


def _report_json(report: Any) -> Any:
    """A GC report as plain data (``to_json()``, a dataclass, or its attributes)."""
    if report is None:
        return None
    if hasattr(report, "to_json"):
        return report.to_json()
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        return dataclasses.asdict(report)
    if isinstance(report, dict):
        return report
    return {k: v for k, v in vars(report).items() if not k.startswith("_")}


def manifest_summary(m: Manifest, now: float | None = None) -> dict[str, Any]:
    """The JSON view of a materialization used by the daemon's summaries and ``status``."""
    now = time.time() if now is None else now
    return {
        "manifest": m.key,
        "id": m.mid,
        "checkpoint_id": m.checkpoint_id,
        "lease_generation": m.lease_generation,
        "created_ms": m.created_ms,
        "age_s": round(max(0.0, now - m.created_ms / 1000), 3),
        "rows": m.rows,
        "bytes": m.bytes,
        "files": sum(len(fs) for op in m.operators.values() for fs in op.files.values()),
        "operators": sorted(m.operators),
        "stats": dict(m.stats),
    }


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
        self._manifests: dict[str, Manifest] = {}
        self._published: dict[str, float] = {}  # manifest key -> clock() when this daemon published it
        self._last_gc_at: float | None = None
        self._holder_logged: tuple[Any, ...] | None = None
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
        self.cycles = 0
        self._held: int | None = None  # the lease generation this daemon held last
        self.published = 0
        self.metrics = DaemonMetrics(self)  # served by run() when metrics_port is set
        self.metrics_server: MetricsServer | None = None

    def __repr__(self) -> str:
        return f"MaterializerDaemon({self.store.url!r}, owner={self.owner!r}, generation={self.lease.generation})"

    # -- one cycle ----------------------------------------------------------------------------

    def _emit(self, what: str, done: int = 0, total: int = 0) -> None:
        if self.progress is not None:
            self.progress(what, done, total)

    def _stopping(self) -> bool:
        return any(e.is_set() for e in self._stop_events)

    def _ensure_lease(self) -> bool:
        """Hold the lease: acquire it if free, renew it once a third of its ttl has passed."""
        lease = self.lease
        if lease.generation is not None:
            if lease.remaining_s() > lease.ttl_s - lease.renew_interval_s:
                return True  # renewed recently; the fencing check before publishing lists again
            if lease.try_acquire():  # held: this renews
                return True
        if self._held is not None and lease.generation is None and lease.lost_reason != "released":
            return False  # lost after holding it: final for run() (see lost_error)
        return lease.try_acquire()

    def lost_error(self) -> FencedError | None:
        """The error that ends :meth:`run` for good once this daemon lost a lease it held
        (expired in a stall longer than the ttl, or taken over), else ``None``."""
        lease = self.lease
        if self._held is None or lease.generation is not None or lease.lost_reason in (None, "released"):
            return None
        holder = None
        with contextlib.suppress(StatelogError):
            holder = current_holder(self.store)
        if holder is not None and holder["generation"] != self._held:
            now = (f"the lease is now held by {holder['owner']!r} (host {holder['host']}, pid "
                   f"{holder['pid']}, generation {holder['generation']})")  # fmt: skip
        else:
            now = "no other daemon holds it yet"
        return FencedError(
            f"materializer {self.owner} lost the materializer lease of {self.store.url} "
            f"(generation {self._held}): {lease.lost_reason}; {now}. It stops for good and "
            "publishes nothing more; restart it if it should take the root again (it then "
            "waits as a standby while another daemon holds the lease)"
        )

    def run_once(self, force: bool = False) -> dict[str, Any]:
        """One cycle (see the module docstring); returns its summary as plain data.

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
        try:
            self._cycle(summary, force)
        finally:
            summary["duration_s"] = round(time.monotonic() - t0, 3)
            self.cycles += 1
            self.last_summary = summary
        return summary

    def _cycle(self, summary: dict[str, Any], force: bool) -> None:
        self._emit("lease")
        if not self._ensure_lease():
            summary["reason"] = self.lease.lost_reason or "the lease is held by another daemon"
            with contextlib.suppress(StatelogError):
                summary["holder"] = current_holder(self.store)
            self._log_standby(summary["holder"])
            return
        generation = self.lease.generation
        self._held = generation
        summary.update(leader=True, generation=generation, action="none")
        self._holder_logged = None
        self._emit("checking for a due checkpoint")
        meta = self._latest_checkpoint()
        key = latest_manifest_key(self.store)
        manifest = load_manifest(self.store, key, self._manifests) if key else None
        now = self.clock()
        if meta is not None:
            summary["latest_checkpoint"] = {"id": meta.checkpoint_id, "tail_bytes": meta.changelog_bytes,
                                            "timestamp_ms": meta.timestamp_ms}
        if manifest is not None:
            summary["latest_materialization"] = manifest_summary(manifest, now)
        reason = due(meta, manifest, now, self._published.get(key or ""), self.interval_s, self.max_tail_bytes)
        if reason is None and force and meta is not None and (
            manifest is None or meta.checkpoint_id > manifest.checkpoint_id
        ):
            reason = REASON_FORCED
        published = False
        if reason is None:
            summary["reason"] = self._why_not(meta, manifest)
            log.debug("nothing to materialize: %s", summary["reason"])
        else:
            assert meta is not None
            summary["reason"] = reason
            published = self._materialize(meta, generation, reason, summary)
        gc_due = published or self._last_gc_at is None or self.clock() - self._last_gc_at >= self.gc_interval_s
        if self.run_gc and summary["action"] != "fenced" and gc_due:
            summary["gc"] = self._gc()

    def _latest_checkpoint(self) -> CheckpointMetadata | None:
        try:
            return self.catalog.latest()
        except CheckpointNotFoundError:  # removed by retention between listing and loading
            return self.catalog.latest()

    def _why_not(self, meta: CheckpointMetadata | None, manifest: Manifest | None) -> str:
        if meta is None:
            return "no checkpoint yet"
        if manifest is not None and meta.checkpoint_id <= manifest.checkpoint_id:
            return f"checkpoint {meta.checkpoint_id} is materialized already"
        if meta.changelog_bytes <= 0:
            return f"checkpoint {meta.checkpoint_id} has no changelog tail"
        return (
            f"checkpoint {meta.checkpoint_id} is not due yet (tail {meta.changelog_bytes} bytes "
            f"< {self.max_tail_bytes}, interval {self.interval_s:g}s not elapsed)"
        )

    def _log_standby(self, holder: dict[str, Any] | None) -> None:
        seen = (holder or {}).get("generation"), (holder or {}).get("owner"), (holder or {}).get("released")
        if seen == self._holder_logged:
            log.debug("standby: lease generation %s held by %s", seen[0], seen[1])
            return
        self._holder_logged = seen
        if holder is None:
            log.info("standby: could not acquire the lease of %s", self.store.url)
        else:
            log.info(
                "standby: lease generation %d of %s is held by %s%s; waiting to take over",
                holder["generation"], self.store.url, holder["owner"],
                " (released)" if holder["released"] else "",
            )

    def _materialize(self, meta: CheckpointMetadata, generation: int, reason: str, summary: dict[str, Any]) -> bool:
        log.info(
            "materializing checkpoint %d (%s; changelog tail %d bytes) with lease generation %d",
            meta.checkpoint_id, reason, meta.changelog_bytes, generation,
        )
        self._emit(f"materializing checkpoint {meta.checkpoint_id}")
        with LeaseKeeper(self.lease) as keeper:

            def progress(what: str, done: int, total: int) -> None:
                if self._stopping():
                    raise _Stopped()
                if keeper.lost.is_set():
                    raise LeaseLostError(f"lease generation {generation} was lost: {self.lease.lost_reason}")
                self._emit(f"checkpoint {meta.checkpoint_id}: {what}", done, total)

            def fence() -> None:
                self.lease.ensure_valid(self.publish_margin_s)

            materializer = Materializer(self.store, self.layout, progress, self.engine)
            materializer._manifests = self._manifests  # share the parsed-manifest cache
            try:
                manifest = materializer.materialize(meta, lease_generation=generation, before_publish=fence)
            except LeaseLostError as exc:
                log.warning(
                    "not publishing the materialization of checkpoint %d: %s", meta.checkpoint_id, exc
                )
                summary.update(action="fenced", leader=False, reason=str(exc))
                return False
        now = self.clock()
        self._published[manifest.key] = now
        self.published += 1
        summary.update(action="materialized", materialization=manifest_summary(manifest, now))
        self._emit(f"published {manifest.mid}")
        return True

    def _gc(self) -> dict[str, Any] | None:
        self._last_gc_at = self.clock()
        if not self.lease.is_valid(self.publish_margin_s):
            log.warning("not collecting garbage: the lease is no longer valid")
            return None
        self._emit("collecting garbage")
        try:
            with LeaseKeeper(self.lease):
                report = collect_garbage(
                    self.store,
                    retain_checkpoints=self.retain_checkpoints,
                    grace_s=self.gc_grace_s,
                    now=self.clock(),
                )
            out = _report_json(report)
            if isinstance(out, dict):
                log.info(
                    "garbage collection: %s object(s) of %s bytes deleted, checkpoints deleted %s, "
                    "%d error(s)",
                    out.get("objects_deleted"), out.get("bytes_deleted"), out.get("checkpoints_deleted"),
                    len(out.get("errors") or ()),
                )
        except StatelogError as exc:
            log.warning("garbage collection failed (retried next time): %s", exc)
            out = {"error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(StatelogError):
            self.lease.prune()
        return out

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
            self.metrics_server = MetricsServer(
                self.metrics.registry, self.health, self.settings.metrics_host, self.settings.metrics_port
            )
        started = time.monotonic()
        give_up = started + self.lease.ttl_s + self.lease.renew_interval_s
        first_holder: tuple[Any, ...] | None = None
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
                except _Stopped:
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
                    if last["leader"] or last["action"] == "fenced":
                        return last
                    holder = last.get("holder") or {}
                    state = (holder.get("generation"), holder.get("renewals"), holder.get("released"))
                    if first_holder is None:
                        first_holder = state
                        # taking over an abandoned lease takes the *holder's* ttl, not ours
                        holder_ttl = (holder.get("ttl_ms") or 0) / 1000.0
                        give_up = max(give_up, started + holder_ttl + self.lease.renew_interval_s)
                    elif state != first_holder or time.monotonic() >= give_up:
                        return last  # the holder is alive (it renewed) or we waited long enough
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
        if self.lease.generation is None:
            return
        try:
            self.lease.release()
        except StatelogError as exc:
            log.warning("could not release the lease (it expires after its ttl): %s", exc)
