"""The materialization part of a daemon cycle: plan, build, publish.

:meth:`Publisher.plan` loads the newest completed checkpoint and the newest published
materialization and asks the trigger policy :func:`~materializer.options.due` whether the
checkpoint must be materialized now (or the cycle is forced). :meth:`Publisher.publish`
builds it (:class:`~materializer.build.Materializer`) with the lease generation as fencing
token: a keeper thread renews the lease meanwhile, and right before the manifest is written
the lease is checked again with a margin that covers the write, so a daemon whose lease
expired or was taken over never publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from materializer.build import MaterializeOptions, Materializer, TableEngine
from materializer.daemon.report import manifest_summary
from materializer.lease import LeaderLease, LeaseKeeper
from materializer.options import REASON_FORCED, due
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import CheckpointNotFoundError, LeaseLostError
from statelog.materialization.manifest import Manifest, latest_manifest_key, load_manifest
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]  # (what, done, total), as in materializer.build


class Stopped(Exception):
    """Raised from the progress hook to abandon a materialization when a stop is requested."""


class Publisher:
    """Materializes the due checkpoints of one root and publishes them under the lease.

    ``clock`` is the daemon's wall clock (the interval trigger), ``emit`` its progress hook,
    ``stopping()`` whether a stop was requested (a running build is then abandoned),
    ``margin_s`` how long the lease must stay valid after the check before publishing.
    """

    def __init__(
        self, store: ObjectStore, catalog: JobCatalog, lease: LeaderLease, clock: Callable[[], float],
        emit: Progress, stopping: Callable[[], bool], margin_s: float,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.lease = lease
        self.clock = clock
        self.emit = emit
        self.stopping = stopping
        self.margin_s = margin_s
        self._manifests: dict[str, Manifest] = {}
        self._published: dict[str, float] = {}  # manifest key -> clock() when this daemon published it
        self.published = 0  # materializations published

    def plan(self, summary: dict[str, Any], force: bool, interval_s: float,
             max_tail_bytes: int) -> tuple[CheckpointMetadata | None, str | None]:  # fmt: skip
        """The newest checkpoint and why it is materialized now (``None``: it is not); fills
        ``summary``'s ``latest_checkpoint``, ``latest_materialization`` and ``reason``."""
        self.emit("checking for a due checkpoint", 0, 0)
        meta = self._latest_checkpoint()
        key = latest_manifest_key(self.store)
        manifest = load_manifest(self.store, key, self._manifests) if key else None
        now = self.clock()
        if meta is not None:
            summary["latest_checkpoint"] = {"id": meta.checkpoint_id, "tail_bytes": meta.changelog_bytes,
                                            "timestamp_ms": meta.timestamp_ms}
        if manifest is not None:
            summary["latest_materialization"] = manifest_summary(manifest, now)
        reason = due(meta, manifest, now, self._published.get(key or ""), interval_s, max_tail_bytes)
        if reason is None and force and meta is not None and (
            manifest is None or meta.checkpoint_id > manifest.checkpoint_id
        ):
            reason = REASON_FORCED
        if reason is None:
            summary["reason"] = self._why_not(meta, manifest, interval_s, max_tail_bytes)
            log.debug("nothing to materialize: %s", summary["reason"])
        else:
            summary["reason"] = reason
        return meta, reason

    def _latest_checkpoint(self) -> CheckpointMetadata | None:
        try:
            return self.catalog.latest()
        except CheckpointNotFoundError:  # removed by retention between listing and loading
            return self.catalog.latest()

    @staticmethod
    def _why_not(meta: CheckpointMetadata | None, manifest: Manifest | None, interval_s: float,
                 max_tail_bytes: int) -> str:  # fmt: skip
        if meta is None:
            return "no checkpoint yet"
        if manifest is not None and meta.checkpoint_id <= manifest.checkpoint_id:
            return f"checkpoint {meta.checkpoint_id} is materialized already"
        if meta.changelog_bytes <= 0:
            return f"checkpoint {meta.checkpoint_id} has no changelog tail"
        return (
            f"checkpoint {meta.checkpoint_id} is not due yet (tail {meta.changelog_bytes} bytes "
            f"< {max_tail_bytes}, interval {interval_s:g}s not elapsed)"
        )

    def publish(
        self, meta: CheckpointMetadata, generation: int | None, reason: str, summary: dict[str, Any],
        layout: MaterializeOptions | None, engine: TableEngine | None,
    ) -> bool:
        """Materialize ``meta`` and publish it with lease ``generation``; ``False`` if fenced
        (the lease was lost: nothing published, ``summary``'s action is ``"fenced"``)."""
        log.info(
            "materializing checkpoint %d (%s; changelog tail %d bytes) with lease generation %d",
            meta.checkpoint_id, reason, meta.changelog_bytes, generation,
        )
        self.emit(f"materializing checkpoint {meta.checkpoint_id}", 0, 0)
        with LeaseKeeper(self.lease) as keeper:

            def progress(what: str, done: int, total: int) -> None:
                if self.stopping():
                    raise Stopped()
                if keeper.lost.is_set():
                    raise LeaseLostError(f"lease generation {generation} was lost: {self.lease.lost_reason}")
                self.emit(f"checkpoint {meta.checkpoint_id}: {what}", done, total)

            def fence() -> None:
                self.lease.ensure_valid(self.margin_s)

            materializer = Materializer(self.store, layout, progress, engine)
            materializer._manifests = self._manifests  # share the parsed-manifest cache
            try:
                manifest = materializer.materialize(meta, lease_generation=generation, before_publish=fence)
            except LeaseLostError as exc:
                log.warning(
                    "not publishing the materialization of checkpoint %d: %s", meta.checkpoint_id, exc
                )
                summary.update(action="fenced", leader=False, reason=str(exc))
                return False
        now = self.clock()
        self._published[manifest.key] = now
        self.published += 1
        summary.update(action="materialized", materialization=manifest_summary(manifest, now))
        self.emit(f"published {manifest.mid}", 0, 0)
        return True
