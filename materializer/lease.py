"""Leader lease with a fencing generation for the materializer daemon (issue #3).

Two daemons started on one job root must never publish concurrently. The lease lives in
the job root itself, as write-once objects below ``materializer/lease/``:

* ``gen-<g:012d>.json``: generation ``g`` was acquired (owner, instance id, host, pid,
  ``acquired_ms``, ``ttl_ms``). Created with :meth:`ObjectStore.put_if_absent`, so of the
  daemons racing for ``g`` exactly one wins. ``g`` is the fencing token: it only grows.
* ``gen-<g:012d>.renew-<n:012d>.json``: the holder's ``n``-th renewal of ``g``.
* ``gen-<g:012d>.released``: the holder released ``g`` on clean shutdown.

Every object is checksummed JSON ``{"crc32": ..., "body": {...}}`` like the other JSON
objects of statelog.

**Expiry without trusting clocks.** Timestamps in the bodies and the store's mtimes are
written by other machines' clocks and are shown by :func:`current_holder` only. A
contender decides expiry from its *own observation*: it records the lease state (newest
generation, its newest renewal, released or not) and the local monotonic time right
after the listing that showed it; the lease is expired once a listing started at least
``ttl`` (the holder's ``ttl_ms``) later still shows the same state. Only clock *rates*
must agree, not clock values. A fresh contender therefore waits one ``ttl`` before it
takes over an abandoned lease, unless the newest generation was released (take over at
once) or was this instance's own (it may re-acquire at once: nobody else holds it).

**Holder's deadline.** The holder considers itself valid until ``start + ttl``, where
``start`` is the local time *before* the acquisition or last successful renewal request
was sent; every contender saw that object at a later time, so its takeover comes later.
A renewal counts only if it completed before the previous deadline; otherwise a
contender may already have decided (from a listing that did not show it yet) and the
lease is lost. :meth:`LeaderLease.is_valid` also lists the lease objects and reports
loss when a higher generation exists; the daemon calls it (or
:meth:`~LeaderLease.ensure_valid`) right before publishing, with a margin that covers
the publish itself, and records the generation in what it publishes.

See ``docs/store.md`` ("Leader lease") for the limits of this scheme.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statelog.errors import (
    ConfigError,
    CorruptionError,
    FormatVersionError,
    LeaseLostError,
    ObjectNotFoundError,
    StoreError,
)
from statelog.store.base import ObjectInfo, ObjectStore

logger = logging.getLogger(__name__)

LEASE_PREFIX = "materializer/lease/"
LEASE_FORMAT = "statelog-lease"
LEASE_VERSION = 1

_GEN_RE = re.compile(r"^gen-(\d{12,})\.json$")
_RENEW_RE = re.compile(r"^gen-(\d{12,})\.renew-(\d{12,})\.json$")
_RELEASED_RE = re.compile(r"^gen-(\d{12,})\.released$")


def generation_key(generation: int) -> str:
    return f"{LEASE_PREFIX}gen-{generation:012d}.json"


def renewal_key(generation: int, seq: int) -> str:
    return f"{LEASE_PREFIX}gen-{generation:012d}.renew-{seq:012d}.json"


def released_key(generation: int) -> str:
    return f"{LEASE_PREFIX}gen-{generation:012d}.released"


# -- encoding --------------------------------------------------------------------------------


def _encode(body: dict[str, Any]) -> bytes:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    wrapped = {"crc32": zlib.crc32(canon), "body": body}
    return json.dumps(wrapped, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _decode(data: bytes, key: str, kind: str, generation: int) -> dict[str, Any]:
    try:
        wrapped = json.loads(data)
        body, crc = wrapped["body"], wrapped["crc32"]
        if not isinstance(body, dict):
            raise TypeError("body is not a JSON object")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(
            f"lease object {key} is not valid JSON of the expected shape: {exc}", key=key
        ) from None
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if zlib.crc32(canon) != crc:
        raise CorruptionError(
            f"lease object {key}: checksum mismatch; the object is corrupt", key=key
        )
    if body.get("format") != LEASE_FORMAT:
        raise CorruptionError(f"{key} is not a statelog lease object", key=key)
    if body.get("version") != LEASE_VERSION:
        raise FormatVersionError(
            f"lease object {key} has format version {body.get('version')}, this build reads "
            f"version {LEASE_VERSION}; upgrade statelog",
            key=key,
        )
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


def _scan(store: ObjectStore) -> _View:
    generations: dict[int, _Generation] = {}
    for info in store.list(LEASE_PREFIX):
        name = info.key[len(LEASE_PREFIX) :]
        if m := _GEN_RE.match(name):
            generations.setdefault(int(m.group(1)), _Generation()).info = info
        elif m := _RENEW_RE.match(name):
            gen = generations.setdefault(int(m.group(1)), _Generation())
            gen.renewals[int(m.group(2))] = info
        elif m := _RELEASED_RE.match(name):
            generations.setdefault(int(m.group(1)), _Generation()).released = info
    newest = max((g for g, gen in generations.items() if gen.info is not None), default=0)
    return _View(generations, newest)


def current_holder(store: ObjectStore) -> dict[str, Any] | None:
    """Describe the newest lease generation of the job root, for display; ``None`` if none.

    Keys: ``generation``, ``owner``, ``instance``, ``host``, ``pid``, ``acquired_ms``,
    ``ttl_ms``, ``renewals`` (newest renewal number), ``renewed_ms`` (holder's wall clock
    of the newest renewal, or ``None``), ``released``, ``expires_hint_ms`` (holder's wall
    clock of the last activity + ttl: a hint only, clocks may be skewed) and
    ``last_activity_mtime`` (the store's mtime of the newest lease object, seconds).
    """
    view = _scan(store)
    if view.newest == 0:
        return None
    g = view.newest
    body = _decode(store.get(generation_key(g)), generation_key(g), "acquire", g)
    renewed_ms: int | None = None
    seq = view.newest_renewal
    if seq:
        with contextlib.suppress(ObjectNotFoundError):  # pruned meanwhile
            key = renewal_key(g, seq)
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


class LeaderLease:
    """A leader lease with a fencing generation on ``store`` (see the module docstring).

    ``clock`` measures time intervals (default :func:`time.monotonic`; tests inject a fake
    one); ``wall_clock`` only stamps the objects for display. ``ttl_s`` is how long an
    acquisition or renewal stays valid; renew every ``ttl_s / 3`` or so
    (:attr:`renew_interval_s`). The object is thread-safe.
    """

    def __init__(
        self,
        store: ObjectStore,
        owner: str,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(owner, str) or not owner.strip():
            raise ConfigError(f"lease owner must be a non-empty str, got {owner!r}")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0:
            raise ConfigError(f"lease ttl_s must be a number of seconds > 0, got {ttl_s!r}")
        ttl_ms = round(ttl_s * 1000)
        if ttl_ms < 1:
            raise ConfigError(f"lease ttl_s must be at least 1 ms, got {ttl_s!r}")
        self.store = store
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
        self._own_last: int | None = None  # the newest generation this instance acquired
        self._observed: tuple[int, int, bool] | None = None
        self._observed_at = 0.0
        self._holder_ttl: dict[int, float] = {}
        self.lost_reason: str | None = None

    def __repr__(self) -> str:
        return (
            f"LeaderLease({self.store.url!r}, owner={self.owner!r}, "
            f"generation={self._generation}, ttl_s={self.ttl_s})"
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

    # -- acquisition -----------------------------------------------------------------------

    def try_acquire(self) -> bool:
        """Acquire the next generation if the lease is free; ``True`` if held afterwards.

        Free means: no lease yet, the newest generation was released or was this
        instance's own, or this instance has seen it unchanged for the holder's ttl
        (call this periodically; the first call only starts observing). On a held lease
        this is :meth:`renew`. Store errors propagate.
        """
        with self._lock:
            if self._generation is not None:
                return self._renew()
            start = self._clock()
            view = _scan(self.store)
            seen = self._clock()
            newest = view.newest
            if not (newest == 0 or view.released or newest == self._own_last):
                if view.state != self._observed:
                    self._observed, self._observed_at = view.state, seen
                    logger.debug("lease %s: observing generation %d", self.store.url, newest)
                    return False
                ttl = self._ttl_of(newest)
                if ttl is None or start - self._observed_at < ttl:
                    return False
                logger.info(
                    "lease %s: generation %d unchanged for %.1fs (ttl %.1fs), taking over",
                    self.store.url,
                    newest,
                    start - self._observed_at,
                    ttl,
                )
            return self._create_generation(newest + 1)

    def _ttl_of(self, generation: int) -> float | None:
        if generation not in self._holder_ttl:
            key = generation_key(generation)
            try:
                body = _decode(self.store.get(key), key, "acquire", generation)
            except ObjectNotFoundError:
                self._observed = None  # pruned meanwhile: the state changed, observe again
                return None
            self._holder_ttl = {generation: body["ttl_ms"] / 1000.0}  # only the newest
        return self._holder_ttl[generation]

    def _create_generation(self, generation: int) -> bool:
        key = generation_key(generation)
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
                "acquired_ms": int(self._wall_clock() * 1000),
                "ttl_ms": self._ttl_ms,
            }
        )
        started = self._clock()
        created = self._create(key, data)
        self._observed = None
        if not created:
            logger.info(
                "lease %s: generation %d taken by another daemon", self.store.url, generation
            )
            return False
        # Fencing post-check: a higher generation can only exist if lease objects were
        # deleted by hand (or pruned while this instance had a stale view).
        newest = _scan(self.store).newest
        if newest > generation:
            logger.warning(
                "lease %s: created generation %d but generation %d exists; not held",
                self.store.url,
                generation,
                newest,
            )
            return False
        self._generation, self._deadline, self._seq = generation, started + self.ttl_s, 0
        self._own_last = generation
        self.lost_reason = None
        logger.info(
            "lease %s: acquired generation %d as %s (ttl %.1fs)",
            self.store.url,
            generation,
            self.owner,
            self.ttl_s,
        )
        return True

    def _create(self, key: str, data: bytes) -> bool:
        """``put_if_absent`` that settles an unknown outcome by reading the object back."""
        try:
            return self.store.put_if_absent(key, data)
        except StoreError as exc:
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
            return self._lose(f"generation {g} expired before it was renewed")
        newest = _scan(self.store).newest
        if newest > g:
            return self._lose(f"generation {newest} was acquired by another daemon")
        self._seq += 1  # never reused, even if this attempt fails
        seq = self._seq
        key = renewal_key(g, seq)
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
                "daemon may have taken over"
            )
        self._deadline = started + self.ttl_s
        if seq > 1:  # keep one renewal per generation; best effort (prune catches up)
            with contextlib.suppress(StoreError):
                self.store.delete(renewal_key(g, seq - 1))
        return True

    def _lose(self, reason: str) -> bool:
        logger.warning("lease %s: lost: %s", self.store.url, reason)
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
                return self._lose(f"generation {g} expired")
            if self._clock() + margin_s >= self._deadline:
                return False
            newest = _scan(self.store).newest
            if newest > g:
                return self._lose(f"generation {newest} was acquired by another daemon")
            return self._clock() + margin_s < self._deadline

    def ensure_valid(self, margin_s: float = 0.0) -> int:
        """:meth:`is_valid` that returns the generation or raises :class:`LeaseLostError`."""
        with self._lock:
            g = self._generation
            if self.is_valid(margin_s):
                return g  # type: ignore[return-value]
            reason = self.lost_reason if self._generation is None else None
            raise LeaseLostError(
                f"the materializer lease on {self.store.url} is not valid"
                + (f" for generation {g}" if g is not None else "")
                + f": {reason or f'it expires within the {margin_s}s margin or is not held'}"
                + "; stop publishing and re-acquire the lease"
            )

    def release(self) -> None:
        """Give the lease up on clean shutdown so another daemon may acquire at once.

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
            self._create(released_key(g), data)
            logger.info("lease %s: released generation %d", self.store.url, g)

    # -- housekeeping ----------------------------------------------------------------------

    def prune(self, keep: int = 2) -> int:
        """Delete the lease objects of all but the newest ``keep`` generations, and every
        renewal but the newest of the kept ones; returns the number of deleted objects.

        The newest generation object is always kept, so generations never restart at 1
        (never delete ``materializer/lease/`` by hand while a daemon may run).
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"prune keep must be an int >= 1, got {keep!r}")
        view = _scan(self.store)
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
            logger.info("lease %s: pruned %d lease object(s)", self.store.url, deleted)
        return deleted
