"""Where a new backend's state starts: empty, or the checkpoint its ``restore=`` names.

:func:`check_fresh_start` refuses an implicit empty start where the newest checkpoint holds
the operator's state; :func:`start_restore` reads the checkpoint's state at once
(:mod:`statelog.restore.eager`) or opens an on-demand restore (:mod:`statelog.restore.plan`).
"""

from __future__ import annotations

from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import RestoreRequiredError
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import Manifest
from statelog.restore.changes import RestoredChanges
from statelog.restore.eager import read_restored
from statelog.restore.ondemand.loader import KeyGroupLoader
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.restore.plan import plan_restored
from statelog.store.base import ObjectStore


def check_fresh_start(catalog: JobCatalog, operator_uid: str) -> None:
    """Refuse an implicit empty start of an operator whose state the newest checkpoint holds:
    it would silently drop that state (and replay the sources' output)."""
    latest = catalog.latest()
    if latest is not None and operator_uid in latest.operators:
        raise RestoreRequiredError(
            f"{catalog.store.url} already has checkpoints and the newest, checkpoint "
            f"{latest.checkpoint_id}, holds state of operator {operator_uid!r}; a backend "
            f"opened without restore= would start empty and lose it. Pass "
            f"restore='latest' (or restore={latest.checkpoint_id}) to continue from it, or "
            f"restore='none' to start fresh on purpose"
        )


def start_restore(
    store: ObjectStore,
    meta: CheckpointMetadata,
    operator_uid: str,
    kgr: KeyGroupRange,
    manifests: dict[str, Manifest],
    *,
    on_demand: bool,
    disk: bool,
    background: bool,
    options: OnDemandOptions,
) -> tuple[RestoredChanges, KeyGroupLoader | None]:
    """The restore of ``operator_uid``'s key groups ``kgr`` at ``meta``: what was read, and
    the loader of the rest when key groups load on demand (``on_demand``, or always for a
    ``disk``-backed working set: the eager restore's whole base in memory is what it must avoid)."""
    if on_demand or disk:
        return plan_restored(
            store, meta, operator_uid, kgr, manifests, disk=disk, background=background, options=options
        )
    return read_restored(store, meta, operator_uid, kgr, manifests, images=True), None
