"""The writer lease of a job root as one process's :class:`~statelog.job.StateJob` holds it.

The lease (:class:`~statelog.checkpoint.writer_lease.WriterLease`) is taken on first use: by
the first backend with a changelog or the first publish, not when the job opens, so a
process that only reads never takes it. Until then ``on_fenced`` callbacks wait here; once
it is held, every write of the process is checked against it (:meth:`RootLease.check_writable`,
the job's :class:`~statelog.store.fencing.FencedStore` guard) and every publish records its
generation (:meth:`RootLease.generation`), so a process that lost the root writes nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from statelog.checkpoint.writer_lease import WriterLease
from statelog.errors import FencedError
from statelog.store.base import ObjectStore


class RootLease:
    """The root's writer lease for one process: taken once, on first use, released at close.

    ``on_fenced`` is called first when the lease is lost (the job fails its changelog
    writer), then the callbacks registered with :meth:`on_fenced`.
    """

    def __init__(
        self, store: ObjectStore, ttl_s: float, owner: str | None, on_fenced: Callable[[FencedError], None],
        poll_s: float | None = None,
    ) -> None:
        self._store = store  # the unfenced store: the lease's own objects
        self._ttl_s = ttl_s
        self._owner = owner
        self.poll_s = poll_s  # how often a contender lists the lease while it observes a holder
        self._callbacks: list[Callable[[FencedError], None]] = [on_fenced]
        self.lease: WriterLease | None = None

    def acquire(self) -> int | None:
        """Take the lease (once; later calls return the held generation).

        Raises :class:`LeaseHeldError` when another live process holds it, and
        :class:`LeaseLostError` once it was lost.
        """
        if self.lease is None:
            lease = WriterLease(self._store, ttl_s=self._ttl_s, owner=self._owner, poll_s=self.poll_s)
            lease.acquire()
            self.lease = lease
            for cb in self._callbacks:
                lease.on_fenced(cb)
            self._callbacks.clear()
        if not self.lease.held:
            self.lease.ensure_valid()  # raises LeaseLostError naming the reason
        return self.lease.generation

    def generation(self) -> int:
        """The generation a checkpoint is published under: fencing, right before the publish."""
        self.acquire()
        assert self.lease is not None
        return self.lease.ensure_valid()

    @property
    def fenced(self) -> FencedError | None:
        """Why this process lost the root for good (``None`` while it has not)."""
        return self.lease.fenced if self.lease is not None else None

    def on_fenced(self, callback: Callable[[FencedError], None]) -> None:
        """Call ``callback(error)`` once when the lease is lost (at once if it is)."""
        if self.lease is None:
            self._callbacks.append(callback)
        else:
            self.lease.on_fenced(callback)

    def check_root(self) -> None:
        """Raise :class:`FencedError` if the held lease is lost (one listing of its objects);
        before the lease is taken, nothing to check."""
        if self.lease is not None:
            self.lease.ensure_valid(margin_s=0.0)

    def valid_until(self) -> float | None:
        """The wall-clock time until which the held lease is valid by this process's clock."""
        lease = self.lease
        if lease is None or not lease.held or lease.fenced is not None:
            return None
        return time.time() + lease.remaining_s()

    def check_writable(self) -> None:
        """The guard of every write of the process: raises :class:`FencedError` once lost."""
        if self.lease is not None:
            self.lease.check_writable()

    def release(self) -> None:
        """Give the lease up at close: a successor may start at once."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None
