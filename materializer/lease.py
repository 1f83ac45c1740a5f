"""The materializer daemon's leader lease: a :class:`statelog.checkpoint.lease.Lease` below
``materializer/lease/``.

Two daemons started on one job root must never publish concurrently: the daemon holds this
lease (a fencing generation, renewed every ``ttl / 3``, taken over after a contender saw it
unchanged for a ttl or at once when released), checks it right before publishing and
records the generation in what it publishes. The mechanism, shared with the writer lease of
a job's checkpoint publisher (:mod:`statelog.checkpoint.writer_lease`), is described in
:mod:`statelog.checkpoint.lease` and ``docs/store.md`` ("Leader lease").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from statelog.checkpoint import lease_objects
from statelog.checkpoint.lease import Lease
from statelog.errors import StoreError
from statelog.layout import (
    MATERIALIZER_LEASE_PREFIX,
    lease_generation_key,
    lease_released_key,
    lease_renewal_key,
)
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

__all__ = [
    "LEASE_PREFIX",
    "LeaderLease",
    "current_holder",
    "generation_key",
    "released_key",
    "renewal_key",
]

LEASE_PREFIX = MATERIALIZER_LEASE_PREFIX


def generation_key(generation: int) -> str:
    return lease_generation_key(LEASE_PREFIX, generation)


def renewal_key(generation: int, seq: int) -> str:
    return lease_renewal_key(LEASE_PREFIX, generation, seq)


def released_key(generation: int) -> str:
    return lease_released_key(LEASE_PREFIX, generation)


def current_holder(store: ObjectStore) -> dict[str, Any] | None:
    """The newest generation of the materializer lease, for display (see
    :func:`statelog.checkpoint.lease_objects.current_holder`); ``None`` if no daemon ever took it."""
    return lease_objects.current_holder(store, LEASE_PREFIX)


class LeaderLease(Lease):
    """The materializer daemon's lease on ``store``; see :class:`statelog.checkpoint.lease.Lease`.

    The daemon calls :meth:`try_acquire` each cycle and checks :meth:`is_valid` right before
    publishing; :class:`LeaseKeeper` renews it during a long cycle."""

    def __init__(
        self,
        store: ObjectStore,
        owner: str,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            store,
            owner,
            ttl_s,
            clock,
            prefix=LEASE_PREFIX,
            what="materializer lease",
            contender="daemon",
            wall_clock=wall_clock,
        )


class LeaseKeeper:
    """Renews the lease from a background thread while a long operation runs.

    A renewal that reports the lease lost sets :attr:`lost`; the daemon's progress hook
    then abandons the materialization, and the fencing check before publishing refuses in
    any case. Store errors are logged and retried (the lease stays valid until its deadline).
    """

    def __init__(self, lease: LeaderLease) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="statelog-lease-keeper", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        interval = max(0.01, self.lease.renew_interval_s)
        while not self._done.wait(interval):
            try:
                if not self.lease.renew():
                    log.warning("lease lost during the cycle: %s", self.lease.lost_reason)
                    self.lost.set()
                    return
            except StoreError as exc:
                log.warning("renewing the lease failed (will retry): %s", exc)
                interval = max(0.01, self.lease.renew_interval_s / 3)
            else:
                interval = max(0.01, self.lease.renew_interval_s)
