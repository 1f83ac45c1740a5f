"""Leases with a fencing generation on a job root: one holder at a time (issues #3 and #11).

Two daemons (or two writers) started on one job root must never publish concurrently. A
lease lives in the job root itself, as write-once objects below a *prefix* that names the
lease (``materializer/lease/`` for the materializer daemon, ``writer/lease/`` for the
checkpoint publisher of a job, see :mod:`statelog.writer_lease`):

* ``gen-<g:012d>.json``: generation ``g`` was acquired (owner, instance id, host, pid,
  ``host_id``, ``proc_start``, ``acquired_ms``, ``ttl_ms``). Created with
  :meth:`ObjectStore.put_if_absent`, so of the contenders racing for ``g`` exactly one wins.
  ``g`` is the fencing token: it only grows.
* ``gen-<g:012d>.renew-<n:012d>.json``: the holder's ``n``-th renewal of ``g``.
* ``gen-<g:012d>.released``: the holder released ``g`` on clean shutdown.

Every object is checksummed JSON ``{"crc32": ..., "body": {...}}`` like the other JSON
objects of statelog (:mod:`statelog.envelope`).

**Expiry without trusting clocks.** Timestamps in the bodies and the store's mtimes are
written by other machines' clocks and are shown by :func:`current_holder` only. A
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
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statelog import envelope
from statelog.errors import (
    ConfigError,
    CorruptionError,
    LeaseLostError,
    ObjectNotFoundError,
    StoreError,
    TransientStoreError,
)
from statelog.layout import (
    lease_generation_key,
    lease_released_key,
    lease_renewal_key,
    parse_lease_name,
)
from statelog.store.base import ObjectInfo, ObjectStore

logger = logging.getLogger(__name__)

LEASE_FORMAT = "statelog-lease"
LEASE_VERSION = 1

# the lease objects' keys (statelog.layout): gen-<g>.json, gen-<g>.renew-<n>.json, gen-<g>.released
generation_key = lease_generation_key
renewal_key = lease_renewal_key
released_key = lease_released_key


# -- this process's identity ------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def host_id() -> str | None:
    """What makes a pid meaningful: the boot id and the pid namespace of this process
    (Linux); ``None`` where unknown (then a holder is never declared dead by its pid)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pidns}" if boot else None


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), ``None`` if
    unknown: tells a live holder from another process that reuses its pid."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def holder_process_is_gone(body: dict[str, Any]) -> bool:
    """``True`` only when the acquisition ``body`` names a process of this very host (same
    host name, boot and pid namespace) that no longer runs: the pid does not exist, is a
    zombie, or now belongs to a process started at another time. Anything uncertain
    (another host, no identity recorded) is ``False``: then only the ttl decides."""
    pid, hid = body.get("pid"), body.get("host_id")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or hid is None:
        return False
    if body.get("host") != socket.gethostname() or hid != host_id():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, owned by someone else
    except OSError:
        return False
    stat = _read(f"/proc/{pid}/stat")
    if stat is not None and stat[stat.rindex(")") + 2 :].startswith("Z"):
        return True  # a zombie: dead, not reaped yet
    started = body.get("proc_start")
    return isinstance(started, int) and process_start(pid) not in (None, started)


# -- encoding --------------------------------------------------------------------------------


def _encode(body: dict[str, Any]) -> bytes:
    return envelope.dump(body)


def _decode(data: bytes, key: str, kind: str, generation: int) -> dict[str, Any]:
    body = envelope.load(data, key, "lease object", fmt=LEASE_FORMAT, versions=(LEASE_VERSION,))
    if body.get("kind") != kind or body.get("generation") != generation:
        raise CorruptionError(
            f"lease object {key} holds a {body.get('kind')!r} of generation "
            f"{body.get('generation')!r}, expected a {kind!r} of generation {generation}",
            key=key,
        )
    if kind == "acquire":
        ttl_ms = body.get("ttl_ms")
        if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise CorruptionError(f"lease object {key} has an invalid ttl_ms {ttl_ms!r}", key=key)
    return body


# -- listing ---------------------------------------------------------------------------------


@dataclass
class _Generation:
    info: ObjectInfo | None = None  # the gen-<g>.json object (None: orphaned renewals)
    renewals: dict[int, ObjectInfo] = field(default_factory=dict)
    released: ObjectInfo | None = None

    def objects(self) -> list[ObjectInfo]:
        found = list(self.renewals.values())
        if self.released is not None:
            found.append(self.released)
        if self.info is not None:
            found.append(self.info)  # last: prune deletes the generation object last
        return found


@dataclass(frozen=True)
class _View:
    generations: dict[int, _Generation]
    newest: int  # the newest generation with a gen-<g>.json object; 0 if none

    @property
    def newest_renewal(self) -> int:
        gen = self.generations.get(self.newest)
        return max(gen.renewals, default=0) if gen else 0

    @property
    def released(self) -> bool:
        gen = self.generations.get(self.newest)
        return gen is not None and gen.released is not None

    @property
    def state(self) -> tuple[int, int, bool]:
        return (self.newest, self.newest_renewal, self.released)


def _scan(store: ObjectStore, prefix: str) -> _View:
    generations: dict[int, _Generation] = {}
    for info in store.list(prefix):
        parsed = parse_lease_name(info.key[len(prefix) :])
        if parsed is None:
            continue
        what, g, seq = parsed
        if what == "acquire":
            generations.setdefault(g, _Generation()).info = info
        elif what == "renew":
            assert seq is not None
            generations.setdefault(g, _Generation()).renewals[seq] = info
        else:
            generations.setdefault(g, _Generation()).released = info
    newest = max((g for g, gen in generations.items() if gen.info is not None), default=0)
    return _View(generations, newest)


def current_holder(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    """Describe the newest generation of the lease at ``prefix``, for display; ``None`` if none.

    Keys: ``generation``, ``owner``, ``instance``, ``host``, ``pid``, ``acquired_ms``,
    ``ttl_ms``, ``renewals`` (newest renewal number), ``renewed_ms`` (holder's wall clock
    of the newest renewal, or ``None``), ``released``, ``expires_hint_ms`` (holder's wall
    clock of the last activity + ttl: a hint only, clocks may be skewed) and
    ``last_activity_mtime`` (the store's mtime of the newest lease object, seconds).
    """
    view = _scan(store, prefix)
    if view.newest == 0:
        return None
    g = view.newest
    body = _decode(store.get(generation_key(prefix, g)), generation_key(prefix, g), "acquire", g)
    renewed_ms: int | None = None
    seq = view.newest_renewal
    if seq:
        with contextlib.suppress(ObjectNotFoundError):  # pruned meanwhile
            key = renewal_key(prefix, g, seq)
            renewed_ms = int(_decode(store.get(key), key, "renew", g)["renewed_ms"])
    gen = view.generations[g]
    last = max(info.mtime for info in gen.objects())
    return {
        "generation": g,
        "owner": body.get("owner"),
        "instance": body.get("instance"),
        "host": body.get("host"),
        "pid": body.get("pid"),
        "acquired_ms": body.get("acquired_ms"),
        "ttl_ms": body["ttl_ms"],
        "renewals": seq,
        "renewed_ms": renewed_ms,
        "released": gen.released is not None,
        "expires_hint_ms": (renewed_ms or int(body.get("acquired_ms") or 0)) + body["ttl_ms"],
        "last_activity_mtime": last,
    }


# -- the lease -------------------------------------------------------------------------------


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
            view = _scan(self.store, self.prefix)
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
                    self.what,
                    self.store.url,
                    newest,
                    start - self._observed_at,
                    body["ttl_ms"] / 1000.0,
                )
            return self._create_generation(newest + 1)

    def _holder_of(self, generation: int) -> dict[str, Any] | None:
        """The acquisition body of ``generation`` (cached for the newest only)."""
        if generation not in self._holder:
            key = generation_key(self.prefix, generation)
            try:
                body = _decode(self.store.get(key), key, "acquire", generation)
            except ObjectNotFoundError:
                self._observed = None  # pruned meanwhile: the state changed, observe again
                return None
            self._holder = {generation: body}
        return self._holder[generation]

    def _create_generation(self, generation: int) -> bool:
        key = generation_key(self.prefix, generation)
        data = _encode(
            {
                "format": LEASE_FORMAT,
                "version": LEASE_VERSION,
                "kind": "acquire",
                "generation": generation,
                "owner": self.owner,
                "instance": self.instance,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "host_id": host_id(),
                "proc_start": process_start(os.getpid()),
                "acquired_ms": int(self._wall_clock() * 1000),
                "ttl_ms": self._ttl_ms,
            }
        )
        started = self._clock()
        self._attempted_at = started
        created = self._create(key, data)
        self._observed = None
        if not created:
            logger.info(
                "%s %s: generation %d taken by another %s",
                self.what, self.store.url, generation, self.contender,
            )
            return False
        # Fencing post-check: a higher generation can only exist if lease objects were
        # deleted by hand (or pruned while this instance had a stale view).
        newest = _scan(self.store, self.prefix).newest
        if newest > generation:
            logger.warning(
                "%s %s: created generation %d but generation %d exists; not held",
                self.what,
                self.store.url,
                generation,
                newest,
            )
            return False
        self._generation, self._deadline, self._seq = generation, started + self.ttl_s, 0
        self._own_last = generation
        self.lost_reason = None
        logger.info(
            "%s %s: acquired generation %d as %s (ttl %.1fs)",
            self.what,
            self.store.url,
            generation,
            self.owner,
            self.ttl_s,
        )
        return True

    def _create(self, key: str, data: bytes) -> bool:
        """``put_if_absent`` that settles an unknown outcome by reading the object back.

        Only a transient failure can hide a create that landed; any other store error (no
        permission to write, refused credentials, no bucket) propagates at once: it is not
        "another holder won" and retrying does not help.
        """
        try:
            return self.store.put_if_absent(key, data)
        except TransientStoreError as exc:
            # The create may have landed before the failure: our bytes (unique through
            # the instance id) under the key mean it did.
            try:
                return self.store.get(key) == data
            except ObjectNotFoundError:
                return False
            except StoreError:
                raise exc from None

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
        newest = _scan(self.store, self.prefix).newest
        if newest > g:
            return self._lose(f"generation {newest} was acquired by another {self.contender}")
        self._seq += 1  # never reused, even if this attempt fails
        seq = self._seq
        key = renewal_key(self.prefix, g, seq)
        data = _encode(
            {
                "format": LEASE_FORMAT,
                "version": LEASE_VERSION,
                "kind": "renew",
                "generation": g,
                "seq": seq,
                "owner": self.owner,
                "instance": self.instance,
                "renewed_ms": int(self._wall_clock() * 1000),
            }
        )
        started = self._clock()
        created = self._create(key, data)
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
            newest = _scan(self.store, self.prefix).newest
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
            data = _encode(
                {
                    "format": LEASE_FORMAT,
                    "version": LEASE_VERSION,
                    "kind": "release",
                    "generation": g,
                    "owner": self.owner,
                    "instance": self.instance,
                    "released_ms": int(self._wall_clock() * 1000),
                }
            )
            self._create(released_key(self.prefix, g), data)
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
        view = _scan(self.store, self.prefix)
        complete = sorted(g for g, gen in view.generations.items() if gen.info is not None)
        kept = set(complete[-keep:])
        deleted = 0
        for g, gen in sorted(view.generations.items()):
            if g in kept:
                newest_seq = max(gen.renewals, default=0)
                doomed = [info for seq, info in gen.renewals.items() if seq != newest_seq]
            elif g > view.newest:
                continue  # orphaned renewals above the newest generation: leave them be
            else:
                doomed = gen.objects()
            for info in doomed:
                self.store.delete(info.key)
                deleted += 1
        if deleted:
            logger.info("%s %s: pruned %d lease object(s)", self.what, self.store.url, deleted)
        return deleted
