"""Build the materialization of one completed checkpoint: its Parquet state tables, then its
manifest, written last (docs/materializer.md, format in docs/format.md sections 8 and 9).

The tables are written by the engine (:class:`statelog.materialization.table_writer.StateTableWriter`:
each handle's materialized base with its changelog ranges applied, unchanged files reused);
this module names the materialization, publishes its manifest (after the caller's fencing
check) and keeps the manifests it read for the next build. Until the manifest exists, the
new files are unreachable leftovers that GC removes after its grace period.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.layout import (
    DATA_PREFIX,
    manifest_key,
    new_materialization_id,
    parse_savepoint_manifest_key,
    table_dir,
)
from statelog.materialization.manifest import Manifest, MaterializedOperator
from statelog.materialization.table_writer import (
    MaterializeOptions,
    Progress,
    StateTableWriter,
    new_stats,
)
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

__all__ = ["InProcessEngine", "MaterializeOptions", "Materializer", "Progress", "TableEngine", "materialize"]


class TableEngine(Protocol):
    """Where the state tables of a materialization are written: in this process
    (:class:`InProcessEngine`, the default) or as Spark tasks (``materializer.spark``)."""

    def write_tables(
        self,
        store: ObjectStore,
        meta: CheckpointMetadata,
        dir_: str,
        self_contained: bool,
        stats: dict[str, Any],
        options: MaterializeOptions,
        progress: Progress | None,
        manifests: dict[str, Manifest],
    ) -> dict[str, MaterializedOperator]:
        """Write the tables of every operator of ``meta`` below ``dir_`` (all durable when
        this returns), add to ``stats`` and return the manifest's operators."""
        ...


class InProcessEngine:
    """The tables written by this process (a thread pool uploads them)."""

    def write_tables(
        self,
        store: ObjectStore,
        meta: CheckpointMetadata,
        dir_: str,
        self_contained: bool,
        stats: dict[str, Any],
        options: MaterializeOptions,
        progress: Progress | None,
        manifests: dict[str, Manifest],
    ) -> dict[str, MaterializedOperator]:
        with StateTableWriter(store, options, progress, manifests) as writer:
            return {uid: writer.write_operator(meta, uid, idx, dir_, self_contained, stats)
                    for idx, uid in enumerate(sorted(meta.operators))}


class Materializer:
    """Writes the materialization of one checkpoint (used by the daemon, tools and tests)."""

    def __init__(
        self,
        store: ObjectStore,
        options: MaterializeOptions | None = None,
        progress: Progress | None = None,
        engine: TableEngine | None = None,
    ) -> None:
        self.store = store
        self.options = options or MaterializeOptions()
        self.progress = progress
        self.engine: TableEngine = engine or InProcessEngine()
        self._manifests: dict[str, Manifest] = {}

    def materialize(
        self,
        meta: CheckpointMetadata,
        *,
        lease_generation: int = 0,
        data_prefix: str = DATA_PREFIX,
        key: str | None = None,
        self_contained: bool = False,
        kind: str = "materialization",
        before_publish: Callable[[], None] | None = None,
    ) -> Manifest:
        """Write the tables and publish the manifest of checkpoint ``meta``.

        ``self_contained`` rewrites every file below ``data_prefix`` (savepoints);
        ``before_publish`` runs right before the manifest is written and may raise to stop
        the publication (the daemon's fencing check).
        """
        t0 = time.monotonic()
        mid = new_materialization_id(meta.checkpoint_id, lease_generation)
        key = key or manifest_key(mid)
        stats = new_stats()
        operators = self.engine.write_tables(self.store, meta, table_dir(mid, data_prefix), self_contained, stats,
                                             self.options, self.progress, self._manifests)
        stats["duration_ms"] = round((time.monotonic() - t0) * 1000, 1)
        manifest = Manifest(
            mid=mid,
            key=key,
            checkpoint_id=meta.checkpoint_id,
            job_id=meta.job_id,
            max_parallelism=meta.max_parallelism,
            created_ms=int(time.time() * 1000),
            lease_generation=lease_generation,
            operators=operators,
            kind=kind,
            stats=stats,
            savepoint=parse_savepoint_manifest_key(key) if kind == "savepoint" else None,
        )
        data, manifest = manifest.stored()
        if before_publish is not None:
            before_publish()
        self.store.put(key, data)
        self._manifests[key] = manifest
        log.info(
            "materialized checkpoint %d as %s: %d rows, %d files written (%d bytes), %d reused, "
            "%d change records applied, in %.2fs",
            meta.checkpoint_id, key, stats["rows"], stats["files_written"], stats["bytes_written"],
            stats["files_reused"], stats["changelog_records"], stats["duration_ms"] / 1000,
        )
        return manifest


def materialize(store: ObjectStore, meta: CheckpointMetadata, **kwargs: Any) -> Manifest:
    """Materialize checkpoint ``meta`` (keyword ``options``: the layout, ``engine``: where
    the tables are written; the rest as :meth:`Materializer.materialize`)."""
    options = kwargs.pop("options", None)
    engine = kwargs.pop("engine", None)
    return Materializer(store, options, engine=engine).materialize(meta, **kwargs)
