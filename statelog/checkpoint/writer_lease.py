"""The writer lease of a job root: one checkpoint publisher per root.

Two copies of a job on one root would publish interleaved checkpoints, each holding only its
own state. The process that publishes checkpoints (a consumer loop's :class:`StateJob`, or the
runtime's job master; not the runtime's workers, which write changelog under their master's
lease) therefore holds a :class:`WriterLease`, a :class:`statelog.checkpoint.lease.Lease`
below ``writer/lease/``:

* **Acquire** (:meth:`WriterLease.acquire`): take the next generation with ``put_if_absent``
  when the lease is free: never taken, released by a clean ``close()``, held by a process of
  this very host that no longer runs (same host name, boot id and pid namespace; the pid is
  gone, a zombie, or reused by a process started at another time), or seen unchanged for the
  holder's ttl (a holder that stopped renewing: crashed, partitioned or frozen). While the
  holder's state is unknown the contender observes the lease; as soon as it sees the holder
  renew (or another contender take it), the holder is alive and :class:`LeaseHeldError` is
  raised, naming the root and the holder (owner, host, pid). So a second live process is
  refused within about a third of the ttl, a crashed one's successor on the same host starts
  at once, and on another host after one ttl (default 10 s).
* **Renew**: a daemon thread renews every ``ttl / 3``. A failed renewal is retried until the
  deadline; a lost lease stops the thread and is reported by the next fencing check.
* **Fence** (:meth:`WriterLease.ensure_valid`): right before a checkpoint metadata object is
  published the holder checks that its deadline is more than a margin away (renewing first if
  needed) and that no higher generation exists; otherwise :class:`LeaseLostError` and nothing
  is published. The generation is recorded in the metadata (``writer_generation``).
* **Fenced for good**: once the held lease is lost (the renewer sees it expired or taken over,
  the fencing check fails, or :meth:`WriterLease.check_writable` finds its deadline passed)
  the lease is *fenced*: :attr:`WriterLease.fenced` holds a :class:`FencedError` naming the
  root, the new holder and what happened, the ``on_fenced`` callbacks run once, and the
  lease is never taken again by this object. Every write of the holding process goes through
  :meth:`~WriterLease.check_writable` (:class:`statelog.store.fencing.FencedStore`), so a
  process that wakes up after a stall longer than the ttl writes nothing more under the root.
* **Release** on ``close()``: the successor starts at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from statelog.checkpoint.lease import Lease
from statelog.checkpoint.lease_objects import current_holder, holder_process_is_gone
from statelog.errors import FencedError, LeaseHeldError, LeaseLostError, StatelogError, StoreError
from statelog.layout import WRITER_LEASE_PREFIX
from statelog.options.engine import WRITER_LEASE_TTL
from statelog.options.values import non_empty_name
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

DEFAULT_WRITER_LEASE_TTL_S = 10.0


def default_owner() -> str:
    """A name for the holder record: the program (no arguments: they may hold secrets)."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    prog = os.path.basename(argv0)
    if prog == "__main__.py":  # python -m PACKAGE: the package's name
        prog = os.path.basename(os.path.dirname(argv0))
    return prog or "python"


def check_writer_lease_ttl(ttl_s: Any) -> float:
    """The writer lease ttl in seconds, or :class:`ConfigError` outside [50ms, 1h]
    (``statelog.options.engine.WRITER_LEASE_TTL``)."""
    return WRITER_LEASE_TTL.check(ttl_s)


class WriterLease(Lease):
    """The writer lease of the job root in ``store`` for this process (module docstring).

    ``ttl_s`` is how long the holder stays valid without renewing (renewed every ``ttl_s/3``);
    ``clock`` and ``poll_s`` (the contender's listing interval while it observes a holder)
    are for tests. Callers use :meth:`acquire`, :meth:`ensure_valid`, :meth:`check_writable`
    and :meth:`release`; the renewer thread renews. Thread-safe.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        owner: str | None = None,
        ttl_s: float = DEFAULT_WRITER_LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float | None = None,
        holder_is_dead: Callable[[dict[str, Any]], bool] = holder_process_is_gone,
    ) -> None:
        check_writer_lease_ttl(ttl_s)
        super().__init__(
            store,
            default_owner() if owner is None else non_empty_name("writer_owner", owner),
            ttl_s,
            clock,
            prefix=WRITER_LEASE_PREFIX,
            what="writer lease",
            contender="writer",
        )
        self._poll_s = poll_s if poll_s is not None else min(0.5, ttl_s / 10)
        self._holder_is_dead = holder_is_dead
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fenced: FencedError | None = None
        self._last_generation: int | None = None  # the generation this process held last
        self._fence_lock = threading.Lock()
        self._on_fenced: list[Callable[[FencedError], None]] = []

    def __repr__(self) -> str:
        return f"WriterLease({self.store.url!r}, generation={self.generation})"

    @property
    def held(self) -> bool:
        return self._generation is not None

    def remaining_s(self) -> float:
        """Seconds until the held lease expires by the local clock, 0 when not held (lock-free:
        the renewer may hold the lease's lock during a store request)."""
        if self._generation is None:
            return 0.0
        return max(0.0, self._deadline - self._clock())

    @property
    def fenced(self) -> FencedError | None:
        """The error that ended this process's hold on the root, ``None`` while not fenced."""
        return self._fenced

    def on_fenced(self, callback: Callable[[FencedError], None]) -> None:
        """Call ``callback(error)`` once when the lease is fenced (at once if it already is);
        it runs on whichever thread noticed the loss and must not block."""
        with self._fence_lock:
            if self._fenced is None:
                self._on_fenced.append(callback)
                return
        callback(self._fenced)

    def check_writable(self) -> None:
        """Raise the :class:`FencedError` if this process may no longer write under the root:
        the lease was lost, or it is held but its deadline passed (a stall: a contender may
        have taken over already). Lock-free and without I/O until the loss is found: it
        guards every write of the holding process. Before the first acquisition (and after
        a clean release) writes are not this lease's business."""
        if self._fenced is not None:
            raise self._fenced
        if self.expired():
            raise self._fence(self._lease_lost_reason())

    def _lease_lost_reason(self) -> str:
        with self._lock:
            g = self._generation
            if g is not None and self.expired():
                self._lose(self._expired_reason(g))
            return self.lost_reason or "the lease is no longer held"

    def _fence(self, reason: str) -> FencedError:
        """Fence this lease for good with ``reason``; returns the (first) error."""
        with self._fence_lock:
            if self._fenced is not None:
                return self._fenced
            holder: dict[str, Any] | None = None
            with contextlib.suppress(StatelogError):  # the message only: a root cut off still fences
                holder = current_holder(self.store, WRITER_LEASE_PREFIX)
            if holder is not None and holder["generation"] != self._last_generation:
                who = (
                    f"{holder['owner']!r} (host {holder['host']}, pid {holder['pid']}, "
                    f"generation {holder['generation']})"
                )
                now = f"the root is now held by {who}"
            else:
                now = "no other process holds it yet, but one may take it over at any moment"
            self._fenced = FencedError(
                f"this process lost the job root {self.store.url}: {reason}; {now}. It stops "
                "for good: no restart, no restore, no sink recovery or commit, no further write "
                "under the root. If the other process should not own the root, stop it and "
                "start this job again (it restores the latest checkpoint); to survive longer "
                "stalls, raise writer_lease_ttl_s (docs/store.md, 'Stalls and the writer lease')"
            )
            callbacks, self._on_fenced = self._on_fenced, []
        self._stop.set()  # the renewer has nothing left to renew
        log.error("%s", self._fenced)
        for cb in callbacks:
            try:
                cb(self._fenced)
            except Exception:  # noqa: BLE001 - one callback's failure must not hide the fence
                log.exception("writer lease of %s: an on_fenced callback failed", self.store.url)
        return self._fenced

    # -- acquisition ---------------------------------------------------------------------------

    def acquire(self) -> int:
        """Take the lease (returns the generation) or raise :class:`LeaseHeldError`.

        Blocks at most about one holder ttl (observing a holder whose liveness is unknown);
        store errors propagate.
        """
        if self.held:
            return self._generation  # type: ignore[return-value]
        changes = self.observed_changes
        waited_from = self._clock()
        while True:
            if self._fenced is not None:
                raise self._fenced  # lost once: never taken again by this process
            if self.try_acquire(self._holder_is_dead):
                self._last_generation = self._generation
                self._start_renewer()
                with contextlib.suppress(StoreError):  # older generations: housekeeping only
                    self.prune(keep=2)
                return self._generation  # type: ignore[return-value]
            holder = current_holder(self.store, WRITER_LEASE_PREFIX)
            if holder is not None and holder["released"]:
                continue  # released meanwhile (or raced by another contender): look again
            if self.observed_changes > changes and holder is not None:
                raise self._held_error(holder, self._clock() - waited_from)
            limit = (holder["ttl_ms"] / 1000.0 if holder else self.ttl_s) * 3 + 5
            if self._clock() - waited_from > limit:  # the lease keeps changing hands
                raise self._held_error(holder, self._clock() - waited_from)
            time.sleep(self._poll_s)

    def _held_error(self, holder: dict[str, Any] | None, waited: float) -> LeaseHeldError:
        if holder is None:
            who = "another process"
        else:
            who = (
                f"{holder['owner']!r} (host {holder['host']}, pid {holder['pid']}, "
                f"generation {holder['generation']})"
            )
        ttl = holder["ttl_ms"] / 1000.0 if holder else self.ttl_s
        return LeaseHeldError(
            f"the job root {self.store.url} is being written by another live process: its writer "
            f"lease is held by {who}, which renewed it while this process waited {waited:.1f}s; "
            "two writers on one root would interleave their checkpoints. Stop that process "
            f"first (a clean close releases the lease at once; a crashed one is taken over "
            f"{ttl:g}s after its last renewal, at once on the same host), or use another root"
        )

    # -- holding -------------------------------------------------------------------------------

    def _start_renewer(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="writer-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_interval_s):
            try:
                if not self.renew():
                    if self.lost_reason != "released":
                        self._fence(self.lost_reason or "the lease is no longer held")
                    return
            except StoreError as exc:  # held until the deadline: retried at the next round
                log.warning("writer lease of %s: renewal failed (%s); retrying", self.store.url, exc)

    def ensure_valid(self, margin_s: float | None = None) -> int:
        """The fencing check right before publishing: the held generation, or
        :class:`LeaseLostError` (publish nothing). ``margin_s`` (default ttl/4) must cover
        the publish; a lease that would expire within it is renewed first."""
        margin = self.ttl_s / 4 if margin_s is None else margin_s
        if self._fenced is not None:
            raise self._fenced
        if self._generation is None and self._last_generation is not None and self.lost_reason != "released":
            raise self._fence(self.lost_reason or "the lease is no longer held")
        if self._generation is None:
            raise LeaseLostError(
                f"this process does not hold the writer lease of {self.store.url}"
                + (f" ({self.lost_reason})" if self.lost_reason else "")
                + ": another writer may have taken over the root, so this process must not "
                "publish checkpoints; stop it, and restart it from the latest checkpoint once "
                "the other writer is gone"
            )
        if super().remaining_s() <= margin:
            try:
                self.renew()
            except StoreError as exc:
                log.warning("writer lease of %s: renewal failed (%s)", self.store.url, exc)
        try:
            return super().ensure_valid(margin)
        except LeaseLostError as exc:
            if self._generation is None:  # lost (expired or taken over): for good
                raise self._fence(self.lost_reason or str(exc)) from None
            raise LeaseLostError(  # still held, but it would expire within the margin
                f"{exc}. Another writer may take over {self.store.url} before the publish "
                "completes: this process must not publish checkpoints now"
            ) from None

    def release(self) -> None:
        """Stop renewing and release the lease (best effort: it expires after its ttl)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        try:
            super().release()
        except StoreError as exc:
            log.warning(
                "writer lease of %s: release failed (%s); it expires after %gs",
                self.store.url,
                exc,
                self.ttl_s,
            )
