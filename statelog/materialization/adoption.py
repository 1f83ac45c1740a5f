"""The newest materialization a job's backends build on.

At each checkpoint a job looks for a newer published materialization (one LIST request, at
most every ``max_age_s``) and lets its live backends adopt it as their base, so their next
checkpoints reference its tables plus only the changelog after it. Adoption is optional: a
listing that fails, or a manifest that fails verification, leaves the backends on their
current base and is logged; it never fails the checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from statelog.errors import CorruptionError, StoreError
from statelog.materialization.manifest import Manifest, latest_manifest_key, load_manifest
from statelog.store.base import ObjectStore


class Adopter(Protocol):
    """What adopts a materialization: a keyed backend."""

    def adopt_materialization(self, manifest: Manifest) -> bool: ...


class MaterializationWatch:
    """The newest materialization of the root in ``store`` and the parsed manifests (shared
    with the job's restores: manifests are immutable). ``log`` is the job's logger."""

    def __init__(self, store: ObjectStore, log: logging.Logger) -> None:
        self.store = store
        self.manifests: dict[str, Manifest] = {}
        self._log = log
        self._latest_key: str | None = None
        self._checked = 0.0

    def latest(self, max_age_s: float = 0.0) -> Manifest | None:
        """The newest published materialization (listed at most every ``max_age_s`` seconds)."""
        now = time.monotonic()
        if self._latest_key is None or now - self._checked >= max_age_s:
            self._checked = now
            self._latest_key = latest_manifest_key(self.store)
        if self._latest_key is None:
            return None
        return load_manifest(self.store, self._latest_key, self.manifests)

    def adopt(self, backends: Sequence[Adopter], max_age_s: float) -> Manifest | None:
        """Let ``backends`` (the live ones) build on the newest usable materialization."""
        if not backends:
            return None
        try:
            m = self.latest(max_age_s)
        except StoreError as exc:  # optional: the backends keep their current base
            self._log.warning(
                "could not look for a newer materialization of %s (%s); checkpointing on the "
                "current base", self.store.url, exc,
            )
            return None
        except CorruptionError as exc:  # never adopted; the job does not depend on it
            self._log.error(
                "the newest materialization of %s fails verification (%s); checkpointing on "
                "the current base (run `statelog verify` on the root)", self.store.url, exc,
            )
            return None
        if m is None:
            return None
        for b in backends:
            b.adopt_materialization(m)
        return m
