"""The daemon's hold on the leader lease: leader, standby, or fenced for good.

:class:`LeaseHolding` acquires the lease when it is free and renews it once a third of its
ttl has passed; a daemon that does not hold it is a *standby* and logs who does (once per
holder). A daemon that lost a lease it held (it stalled longer than the ttl, or another
daemon took over) never takes it back on its own: :meth:`LeaseHolding.lost_error` is the
:class:`~statelog.errors.FencedError` that ends the daemon's loop.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from materializer.lease import LeaderLease, current_holder
from statelog.errors import FencedError, StatelogError
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)


class LeaseHolding:
    """One daemon's view of the leader lease of ``store``: ``held`` is the generation it held last."""

    def __init__(self, store: ObjectStore, lease: LeaderLease, owner: str) -> None:
        self.store = store
        self.lease = lease
        self.owner = owner
        self.held: int | None = None  # the lease generation this daemon held last
        self._holder_logged: tuple[Any, ...] | None = None

    def ensure(self) -> bool:
        """Hold the lease: acquire it if free, renew it once a third of its ttl has passed."""
        lease = self.lease
        if lease.generation is not None:
            if lease.remaining_s() > lease.ttl_s - lease.renew_interval_s:
                return True  # renewed recently; the fencing check before publishing lists again
            if lease.try_acquire():  # held: this renews
                return True
        if self.held is not None and lease.generation is None and lease.lost_reason != "released":
            return False  # lost after holding it: final for run() (see lost_error)
        return lease.try_acquire()

    def lead(self) -> int | None:
        """Record that this daemon holds the lease now (:meth:`ensure` said so); returns its generation."""
        generation = self.lease.generation
        self.held = generation
        self._holder_logged = None
        return generation

    def standby(self, summary: dict[str, Any]) -> None:
        """Fill a standby cycle's ``reason`` and ``holder`` and log who holds the lease."""
        summary["reason"] = self.lease.lost_reason or "the lease is held by another daemon"
        with contextlib.suppress(StatelogError):
            summary["holder"] = current_holder(self.store)
        self._log_standby(summary["holder"])

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

    def lost_error(self) -> FencedError | None:
        """The error that ends the daemon's loop for good once it lost a lease it held
        (expired in a stall longer than the ttl, or taken over), else ``None``."""
        lease = self.lease
        if self.held is None or lease.generation is not None or lease.lost_reason in (None, "released"):
            return None
        holder = None
        with contextlib.suppress(StatelogError):
            holder = current_holder(self.store)
        if holder is not None and holder["generation"] != self.held:
            now = (f"the lease is now held by {holder['owner']!r} (host {holder['host']}, pid "
                   f"{holder['pid']}, generation {holder['generation']})")  # fmt: skip
        else:
            now = "no other daemon holds it yet"
        return FencedError(
            f"materializer {self.owner} lost the materializer lease of {self.store.url} "
            f"(generation {self.held}): {lease.lost_reason}; {now}. It stops for good and "
            "publishes nothing more; restart it if it should take the root again (it then "
            "waits as a standby while another daemon holds the lease)"
        )

    def release(self) -> None:
        """Give the lease up (on clean shutdown) so that a standby takes over at once."""
        if self.lease.generation is None:
            return
        try:
            self.lease.release()
        except StatelogError as exc:
            log.warning("could not release the lease (it expires after its ttl): %s", exc)
