"""Leases with a fencing generation on a job root: one holder at a time.

Two daemons (or two writers) started on one job root must never publish concurrently. A
lease lives in the job root itself, as write-once objects below a *prefix* that names the
lease (:mod:`statelog.checkpoint.lease_objects`): the holder creates ``gen-<g>.json`` for
its generation ``g`` (the fencing token: it only grows), a renewal object now and then, and
a release marker on clean shutdown. :class:`Lease` is the state machine of one contender
or holder; the materializer daemon's leader lease (``materializer/lease.py``) and the
writer lease of a job's checkpoint publisher (:mod:`statelog.checkpoint.writer_lease`)
extend it with their prefix.

**Expiry without trusting clocks.** Timestamps in the bodies and the store's mtimes are
written by other machines' clocks and are shown by
:func:`~statelog.checkpoint.lease_objects.current_holder` only. A
contender decides expiry from its *own observation*: it records the lease state (newest
generation, its newest renewal, released or not) and the local monotonic time right
after the listing that showed it; the lease is expired once a listing started at least
``ttl`` (the holder's ``ttl_ms``) later still shows the same state. Only clock *rates*
must agree, not clock values. A fresh contender therefore waits one ``ttl`` before it
takes over an abandoned lease, unless the newest generation was released (take over at
once), was this instance's own (it may re-acquire at once: nobody else holds it), or the
caller's ``holder_is_dead`` check says the holder is gone (the writer lease: a holder on
this very host whose process no longer exists).

**Holder's deadline.** The holder considers itself valid until ``start + ttl``, where
``start`` is the local time *before* the acquisition or last successful renewal request
was sent; every contender saw that object at a later time, so its takeover comes later.
A renewal counts only if it completed before the previous deadline; otherwise a
contender may already have decided (from a listing that did not show it yet) and the
lease is lost. :meth:`Lease.is_valid` also lists the lease objects and reports
loss when a higher generation exists; the holder calls it (or
:meth:`~Lease.ensure_valid`) right before publishing, with a margin that covers
the publish itself, and records the generation in what it publishes.

See ``docs/store.md`` ("Leader lease") for the limits of this scheme.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from statelog.checkpoint.lease_objects import (
    acquisition,
    create_once,
    generation_key,
    prunable,
    read_object,
    release_marker,
    released_key,
    renewal,
    renewal_key,
    scan,
)
from statelog.errors import ConfigError, LeaseLostError, ObjectNotFoundError, StoreError
from statelog.store.base import ObjectStore

logger = logging.getLogger(__name__)


class Lease:
    """A lease with a fencing generation on ``store`` below ``prefix`` (module docstring).

    ``clock`` measures time intervals (default :func:`time.monotonic`; tests inject a fake
    one); ``wall_clock`` only stamps the objects for display. ``ttl_s`` is how long an
    acquisition or renewal stays valid; renew every ``ttl_s / 3`` or so
    (:attr:`renew_interval_s`). ``what`` names the lease and ``contender`` the kind of
    process that takes it, in messages. The object is thread-safe.
    """

    def __init__(
        self,
        store: ObjectStore,
        owner: str,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        prefix: str,
        what: str = "lease",
        contender: str = "process",
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not prefix.endswith("/"):
            raise ConfigError(f"a lease prefix ends with '/', got {prefix!r}")
        if not isinstance(owner, str) or not owner.strip():
            raise ConfigError(f"lease owner must be a non-empty str, got {owner!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0:
            raise ConfigError(f"lease ttl_s must be a number of seconds > 0, got {ttl_s!r}")
        ttl_ms = round(ttl_s * 1000)
        if ttl_ms < 1:
            raise ConfigError(f"lease ttl_s must be at least 1 ms, got {ttl_s!r}")
        self.store = store
        self.prefix = prefix
        self.what = what
        self.contender = contender
        self.owner = owner
        # The holder's deadline and the contenders' wait use the very same ttl (ms).
        self._ttl_ms = ttl_ms
        self.ttl_s = ttl_ms / 1000.0
        self.instance = uuid.uuid4().hex  # tells this instance's objects from others'
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.RLock()
        self._generation: int | None = None
        self._deadline = 0.0
        self._seq = 0  # the last renewal number attempted in the held generation
        self._attempted_at = 0.0  # when the holder last acquired or tried to renew (clock)
        self._own_last: int | None = None  # the newest generation this instance acquired
        self._observed: tuple[int, int, bool] | None = None
        self._observed_at = 0.0
        self._holder: dict[int, dict[str, Any]] = {}
        self.lost_reason: str | None = None
        self.observed_changes = 0  # how often a contender saw the lease state change

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.store.url!r}, prefix={self.prefix!r}, "
            f"owner={self.owner!r}, generation={self._generation}, ttl_s={self.ttl_s})"
        )

    @property
    def generation(self) -> int | None:
        """The held generation (the fencing token), or ``None`` when not held."""
        return self._generation

    @property
    def renew_interval_s(self) -> float:
        return self.ttl_s / 3

    def remaining_s(self) -> float:
        """Seconds until the held lease expires by the local clock (0 when not held)."""
        with self._lock:
            if self._generation is None:
                return 0.0
            return max(0.0, self._deadline - self._clock())

    def expired(self) -> bool:
        """The held lease's deadline passed without a renewal (lock-free: for checks on every
        write while a renewal may hold the lock); ``False`` when not held."""
        return self._generation is not None and self._clock() >= self._deadline

    def _expired_reason(self, g: int) -> str:
        """Why generation ``g`` expired: a stall of this process (no renewal attempted for
        longer than a renewal interval) or renewals that failed until the deadline."""
        now = self._clock()
        silent = now - (self._deadline - self.ttl_s)  # since the last successful (re)newal
        idle = now - self._attempted_at
        if idle > self.renew_interval_s * 1.5:
            return (
                f"generation {g} expired: this process stalled for {idle:.1f}s (a GC pause, "
                f"SIGSTOP or a frozen VM; last renewed {silent:.1f}s ago), longer than the "
                f"lease ttl {self.ttl_s:g}s"
            )
        return (
            f"generation {g} expired: not renewed for {silent:.1f}s, longer than the lease "
            f"ttl {self.ttl_s:g}s (its renewals failed: is the store reachable?)"
        )

    # -- acquisition -----------------------------------------------------------------------

    def try_acquire(self, holder_is_dead: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """Acquire the next generation if the lease is free; ``True`` if held afterwards.

        Free means: no lease yet, the newest generation was released or was this
        instance's own, ``holder_is_dead(acquisition body)`` says its holder is gone, or
        this instance has seen it unchanged for the holder's ttl (call this periodically;
        the first call only starts observing, and :attr:`observed_changes` counts the
        changes seen). On a held lease this is :meth:`renew`. Store errors propagate.
        """
        with self._lock:
            if self._generation is not None:
                return self._renew()
            start = self._clock()
            view = scan(self.store, self.prefix)
            seen = self._clock()
            newest = view.newest
            if not (newest == 0 or view.released or newest == self._own_last):
                body = self._holder_of(newest) if holder_is_dead is not None else None
                if body is not None and holder_is_dead is not None and holder_is_dead(body):
                    logger.info(
                        "%s %s: the holder of generation %d (pid %s on %s) is gone, taking over",
                        self.what, self.store.url, newest, body.get("pid"), body.get("host"),
                    )
                    return self._create_generation(newest + 1)
                if view.state != self._observed:
                    if self._observed is not None:
                        self.observed_changes += 1
                    self._observed, self._observed_at = view.state, seen
                    logger.debug("%s %s: observing generation %d", self.what, self.store.url, newest)
                    return False
                body = self._holder_of(newest)
                if body is None or start - self._observed_at < body["ttl_ms"] / 1000.0:
                    return False
                logger.info(
                    "%s %s: generation %d unchanged for %.1fs (ttl %.1fs), taking over",
                    self.what, self.store.url, newest, start - self._observed_at, body["ttl_ms"] / 1000.0,
                )
            return self._create_generation(newest + 1)

    def _holder_of(self, generation: int) -> dict[str, Any] | None:
        """The acquisition body of ``generation`` (cached for the newest only)."""
        if generation not in self._holder:
            key = generation_key(self.prefix, generation)
            try:
                body = read_object(self.store, key, "acquire", generation)
            except ObjectNotFoundError:
                self._observed = None  # pruned meanwhile: the state changed, observe again
                return None
            self._holder = {generation: body}
        return self._holder[generation]

    def _create_generation(self, generation: int) -> bool:
        key = generation_key(self.prefix, generation)
        data = acquisition(generation, self.owner, self.instance, self._ttl_ms, int(self._wall_clock() * 1000))
        started = self._clock()
        self._attempted_at = started
        created = create_once(self.store, key, data)
        self._observed = None
        if not created:
            logger.info(
                "%s %s: generation %d taken by another %s",
                self.what, self.store.url, generation, self.contender,
            )
            return False
        # Fencing post-check: a higher generation can only exist if lease objects were
        # deleted by hand (or pruned while this instance had a stale view).
        newest = scan(self.store, self.prefix).newest
        if newest > generation:
            logger.warning(
                "%s %s: created generation %d but generation %d exists; not held",
                self.what, self.store.url, generation, newest,
            )
            return False
        self._generation, self._deadline, self._seq = generation, started + self.ttl_s, 0
        self._own_last = generation
        self.lost_reason = None
        logger.info(
            "%s %s: acquired generation %d as %s (ttl %.1fs)",
            self.what, self.store.url, generation, self.owner, self.ttl_s,
        )
        return True

    # -- holding ---------------------------------------------------------------------------

    def renew(self) -> bool:
        """Extend the held lease; ``False`` if it is lost (or was never held).

        Lost means: the deadline passed, a higher generation exists, or the renewal
        completed too late to count. Store errors propagate and leave the lease held
        until its current deadline (call again).
        """
        with self._lock:
            return self._renew()

    def _renew(self) -> bool:
        g = self._generation
        if g is None:
            return False
        if self._clock() >= self._deadline:
            return self._lose(self._expired_reason(g))
        self._attempted_at = self._clock()
        newest = scan(self.store, self.prefix).newest
        if newest > g:
            return self._lose(f"generation {newest} was acquired by another {self.contender}")
        self._seq += 1  # never reused, even if this attempt fails
        seq = self._seq
        key = renewal_key(self.prefix, g, seq)
        data = renewal(g, seq, self.owner, self.instance, int(self._wall_clock() * 1000))
        started = self._clock()
        created = create_once(self.store, key, data)
        finished = self._clock()
        if not created:
            return self._lose(f"renewal {key} was written by another instance")
        if finished >= self._deadline:
            return self._lose(
                f"renewal {seq} of generation {g} completed after the deadline; another "
                f"{self.contender} may have taken over"
            )
        self._deadline = started + self.ttl_s
        if seq > 1:  # keep one renewal per generation; best effort (prune catches up)
            with contextlib.suppress(StoreError):
                self.store.delete(renewal_key(self.prefix, g, seq - 1))
        return True

    def _lose(self, reason: str) -> bool:
        logger.warning("%s %s: lost: %s", self.what, self.store.url, reason)
        self._generation, self._deadline = None, 0.0
        self.lost_reason = reason
        return False

    def is_valid(self, margin_s: float = 0.0) -> bool:
        """The fencing check to call right before publishing.

        ``True`` iff the lease is held, will not expire within ``margin_s`` (choose it to
        cover the publish), and no higher generation exists (one listing of the lease
        objects). Store errors propagate: do not publish then either.
        """
        with self._lock:
            g = self._generation
            if g is None:
                return False
            if self._clock() >= self._deadline:
                return self._lose(self._expired_reason(g))
            if self._clock() + margin_s >= self._deadline:
                return False
            newest = scan(self.store, self.prefix).newest
            if newest > g:
                return self._lose(f"generation {newest} was acquired by another {self.contender}")
            return self._clock() + margin_s < self._deadline

    def ensure_valid(self, margin_s: float = 0.0) -> int:
        """:meth:`is_valid` that returns the generation or raises :class:`LeaseLostError`."""
        with self._lock:
            g = self._generation
            if self.is_valid(margin_s):
                return g  # type: ignore[return-value]
            reason = self.lost_reason if self._generation is None else None
            raise LeaseLostError(
                f"the {self.what} on {self.store.url} is not valid"
                + (f" for generation {g}" if g is not None else "")
                + f": {reason or f'it expires within the {margin_s}s margin or is not held'}"
                + "; stop publishing and re-acquire the lease"
            )

    def release(self) -> None:
        """Give the lease up on clean shutdown so another contender may acquire at once.

        Local state is dropped first (nothing may be published afterwards); then the
        ``gen-<g>.released`` marker is written. If that fails the error propagates and the
        lease simply expires after its ttl.
        """
        with self._lock:
            g = self._generation
            if g is None:
                return
            self._generation, self._deadline = None, 0.0
            self.lost_reason = "released"
            data = release_marker(g, self.owner, self.instance, int(self._wall_clock() * 1000))
            create_once(self.store, released_key(self.prefix, g), data)
            logger.info("%s %s: released generation %d", self.what, self.store.url, g)

    # -- housekeeping ----------------------------------------------------------------------

    def prune(self, keep: int = 2) -> int:
        """Delete the lease objects of all but the newest ``keep`` generations, and every
        renewal but the newest of the kept ones; returns the number of deleted objects.

        The newest generation object is always kept, so generations never restart at 1
        (never delete the lease's objects by hand while a holder may run).
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"prune keep must be an int >= 1, got {keep!r}")
        deleted = 0
        for info in prunable(scan(self.store, self.prefix), keep):
            self.store.delete(info.key)
            deleted += 1
        if deleted:
            logger.info("%s %s: pruned %d lease object(s)", self.what, self.store.url, deleted)
        return deleted
