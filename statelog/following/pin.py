"""Follower leases: the checkpoint a live follower pins against retention and GC.

A follower (:class:`~statelog.following.follower.Follower`) writes one object,
``followers/<follower id>.json`` (``statelog.follower-lease`` v1 in the JSON envelope,
docs/format.md section 15), naming the checkpoints its replicas build on and, while it moves
on, the one it catches up to or restores, when it was written and its ttl. It writes it when
it moves to another checkpoint and renews it at the latest every third of the ttl while it polls, each time under
the next number (objects are write-once), deleting the previous one; it deletes the last when
it closes. GC (:func:`materializer.gc.collect.collect_garbage`) reads every follower
lease (:func:`live_pins`: the newest object of each follower) and keeps the checkpoints of each live one (written less than its
ttl ago by the GC's clock): their metadata is not deleted by retention, so everything it
references stays live. A follower that died pins nothing once its ttl has passed. A follower
whose credentials cannot write keeps following without a pin (logged once): then the grace
period alone protects what it reads.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass

from statelog import envelope
from statelog.errors import ConfigError, CorruptionError, ObjectNotFoundError, StoreError
from statelog.layout import FOLLOWER_LEASE_PREFIX, follower_lease_key, parse_follower_lease_key
from statelog.store.base import ObjectStore

__all__ = ["DEFAULT_PIN_TTL_S", "FOLLOWER_LEASE_FORMAT", "FOLLOWER_LEASE_VERSION", "FollowerPin", "Pin", "check_pin_ttl", "live_pins"]

log = logging.getLogger(__name__)

FOLLOWER_LEASE_FORMAT = "statelog.follower-lease"
FOLLOWER_LEASE_VERSION = 1
DEFAULT_PIN_TTL_S = 120.0


def check_pin_ttl(value: object) -> float | None:
    """The ttl of a follower lease in seconds (``None``: no lease), or :class:`ConfigError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 86_400:
        raise ConfigError(f"pin_ttl_s must be a number of seconds in [1, 86400] or None (no follower lease), "
                          f"got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Pin:
    """A follower lease as read: follower ``follower``, checkpoints ``checkpoint_ids``, written
    at ``written_ms`` (the follower's wall clock), valid ``ttl_ms`` after that."""

    follower: str
    checkpoint_ids: tuple[int, ...]
    written_ms: int
    ttl_ms: int

    def live(self, now: float) -> bool:
        """Whether the lease still pins at ``now`` (seconds since the epoch)."""
        return (self.written_ms + self.ttl_ms) / 1000 > now


class FollowerPin:
    """The lease of one follower: :meth:`pin` checkpoints, :meth:`renew` while polling,
    :meth:`release` at close. ``ttl_s`` ``None``: no lease is written."""

    def __init__(self, store: ObjectStore, ttl_s: float | None) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self.follower = f"f-{secrets.token_hex(8)}"
        self.key: str | None = None  # the newest lease object written
        self._n = 0
        self.checkpoint_ids: tuple[int, ...] = ()
        self._written = 0.0  # time.monotonic() of the last write
        self._failed = False

    def pin(self, *checkpoint_ids: int) -> None:
        """Pin ``checkpoint_ids`` (written at once when they are other checkpoints)."""
        ids = tuple(sorted(set(checkpoint_ids)))
        if ids != self.checkpoint_ids:
            self.checkpoint_ids = ids
            self._write()

    def renew(self) -> None:
        """Write the lease again if a third of its ttl has passed since the last write."""
        if self._ttl_s is not None and self.checkpoint_ids and (
            time.monotonic() - self._written >= self._ttl_s / 3
        ):
            self._write()

    def _write(self) -> None:
        if self._ttl_s is None or self._failed or not self.checkpoint_ids:
            return
        body = {
            "format": FOLLOWER_LEASE_FORMAT, "version": FOLLOWER_LEASE_VERSION, "follower": self.follower,
            "checkpoint_ids": list(self.checkpoint_ids), "written_ms": int(time.time() * 1000),
            "ttl_ms": int(self._ttl_s * 1000), "host": socket.gethostname(), "pid": os.getpid(),
        }  # fmt: skip
        key = follower_lease_key(self.follower, self._n)
        try:
            self._store.put(key, envelope.dump(body))
            self._written = time.monotonic()
        except StoreError as e:  # (read-only credentials: follow without a pin)
            self._failed = True
            log.warning("follower %s cannot write its lease %s, so it pins no checkpoint against GC (the grace "
                        "period alone protects what it reads): %s", self.follower, key, e)
            return
        self._n += 1
        previous, self.key = self.key, key
        if previous is not None:
            self._delete(previous)

    def _delete(self, key: str) -> None:
        try:
            self._store.delete(key)
        except StoreError as e:  # (it expires after its ttl)
            log.warning("follower %s could not delete its lease object %s (it expires after its ttl): %s",
                        self.follower, key, e)

    def release(self) -> None:
        """Delete the lease (nothing is pinned any more)."""
        if self.key is not None:
            self._delete(self.key)
            self.key = None


def read_pin(store: ObjectStore, key: str) -> Pin:
    """The verified follower lease ``key``; :class:`CorruptionError` when it is not one."""
    body = envelope.load(store.get(key), key, "follower lease", fmt=FOLLOWER_LEASE_FORMAT,
                         versions=(FOLLOWER_LEASE_VERSION,))
    ids = body.get("checkpoint_ids")
    fields = {name: body.get(name) for name in ("written_ms", "ttl_ms")}
    fields.update({f"checkpoint_ids[{i}]": v for i, v in enumerate(ids if isinstance(ids, list) else [None])})
    bad = [f"{n}={v!r}" for n, v in fields.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    follower = body.get("follower")
    parsed = parse_follower_lease_key(key)
    if bad or parsed is None or follower != parsed[0]:
        raise CorruptionError(f"follower lease {key} has invalid fields ({', '.join(bad) or f'follower={follower!r}'}):"
                              " expected a list of checkpoint ids, non-negative integers and the follower id of its "
                              "key", key=key)
    return Pin(follower, tuple(ids), fields["written_ms"], fields["ttl_ms"])  # type: ignore[arg-type]


def live_pins(store: ObjectStore, now: float) -> tuple[list[Pin], list[str]]:
    """The follower leases under the root that are live at ``now`` (seconds since the epoch),
    and the errors of those that could not be read (an unreadable lease pins nothing)."""
    newest: dict[str, tuple[int, str]] = {}  # follower -> its newest lease object (older ones: being deleted)
    for info in store.list(FOLLOWER_LEASE_PREFIX):
        parsed = parse_follower_lease_key(info.key)
        if parsed is not None and parsed[1] >= newest.get(parsed[0], (-1, ""))[0]:
            newest[parsed[0]] = (parsed[1], info.key)
    pins: list[Pin] = []
    errors: list[str] = []
    for _n, key in newest.values():
        try:
            pin = read_pin(store, key)
        except ObjectNotFoundError:
            continue  # (released meanwhile)
        except CorruptionError as e:
            errors.append(f"follower lease {key} is ignored: {e}")
            continue
        if pin.live(now):
            pins.append(pin)
    return pins, errors
