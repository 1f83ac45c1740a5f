"""When the daemon collects garbage, and the collection under its lease.

GC runs after every publication and otherwise every ``gc_every_s`` seconds, only while the
daemon still holds the lease (a keeper thread renews it while GC runs). A failed collection
is logged and retried next time; the daemon's cycle goes on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from materializer.daemon.report import report_json
from materializer.lease import LeaderLease, LeaseKeeper
from statelog.errors import StatelogError
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)


class GcSchedule:
    """Garbage collection of the daemon's root: :meth:`due` says when, :meth:`collect` runs it.

    ``clock`` is the daemon's wall clock, ``emit(what)`` its progress hook, ``margin_s`` how
    long the lease must stay valid for GC to start.
    """

    def __init__(self, store: ObjectStore, lease: LeaderLease, clock: Callable[[], float],
                 emit: Callable[[str], None], margin_s: float) -> None:  # fmt: skip
        self.store = store
        self.lease = lease
        self.clock = clock
        self.emit = emit
        self.margin_s = margin_s
        self.last_at: float | None = None  # clock() when GC last started

    def due(self, published: bool, interval_s: float) -> bool:
        """After a publication, at the first cycle, and once ``interval_s`` passed since the last."""
        return published or self.last_at is None or self.clock() - self.last_at >= interval_s

    def collect(self, retain_checkpoints: int | None, grace_s: float) -> dict[str, Any] | None:
        """Run GC under the lease; returns its report as JSON, ``{"error": ...}`` if it failed,
        ``None`` if the lease is no longer valid (nothing ran)."""
        self.last_at = self.clock()
        if not self.lease.is_valid(self.margin_s):
            log.warning("not collecting garbage: the lease is no longer valid")
            return None
        self.emit("collecting garbage")
        # garbage collection's modules load at the first collection, not at the daemon's start
        from materializer.gc.collect import collect_garbage

        try:
            with LeaseKeeper(self.lease):
                report = collect_garbage(
                    self.store,
                    retain_checkpoints=retain_checkpoints,
                    grace_s=grace_s,
                    now=self.clock(),
                )
            out = report_json(report)
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
