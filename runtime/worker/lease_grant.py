"""Workers write under the root only while their job master's writer lease is valid.

The job master holds the root's writer lease (:mod:`statelog.checkpoint.writer_lease`); its workers
write changelog and sink pre-commit objects under the root without holding it. A master that
stalls (GC pause, SIGSTOP, a frozen VM) stops renewing, while its workers keep running: after
one ttl another copy of the job may take the root over. So the master grants its workers
the right to write until its lease's deadline, as a wall-clock time (``("lease", valid_until)``
on the control connection, sent when the deadline moves); a worker's every write checks the
grant (:class:`statelog.store.fencing.FencedStore`) and fails with
:class:`~statelog.errors.FencedError` once it ran out without a newer one. Workers on another
host compare wall clocks: keep them in sync to well within ``ttl / 10``, the margin taken off
every grant.
"""

from __future__ import annotations

import threading
import time

from statelog.errors import FencedError


class LeaseGrant:
    """The newest write grant of this worker's job master (thread-safe)."""

    def __init__(self, root: str, valid_until: float, ttl_s: float) -> None:
        self.root = root
        self.ttl_s = ttl_s
        self.margin_s = ttl_s / 10  # wall-clock skew between the master's host and this one
        self._valid_until = valid_until
        self._cond = threading.Condition()

    def update(self, valid_until: float) -> None:
        with self._cond:
            if valid_until > self._valid_until:
                self._valid_until = valid_until
                self._cond.notify_all()

    def check(self) -> None:
        """Return if a write is granted now; else wait up to a third of the ttl for a newer
        grant (the master renews every third), then raise :class:`FencedError`."""
        if time.time() < self._valid_until - self.margin_s:
            return
        deadline = time.monotonic() + self.ttl_s / 3
        with self._cond:
            while time.time() >= self._valid_until - self.margin_s:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FencedError(
                        f"the job master's writer lease of {self.root} ran out "
                        f"{time.time() - self._valid_until:.1f}s ago without a renewal reaching "
                        "this worker (the master stalled or is gone; another copy may own the "
                        "root): this worker writes nothing more under it"
                    )
                self._cond.wait(left)
