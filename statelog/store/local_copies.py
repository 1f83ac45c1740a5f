"""Local copies of a root's immutable data objects: task-local recovery.

:class:`LocalCopyStore` wraps a job root's store. Of every changelog segment, state table
and manifest (the object kinds that are written once and never change, see
:data:`COPIED_KINDS`) that this process writes or reads whole, it keeps a copy in a local
directory; later reads of the same object are served from the copy. Everything else
(checkpoint metadata, leases, listings, history, status objects) always goes to the store.

Safety: a copy is used only after it has been verified against the size and CRC-32 recorded
when it was made (from the very bytes the store accepted or returned). A copy that is
missing, truncated or damaged is dropped, logged and the object is read from the store, so a
lost or corrupted directory changes nothing but speed. Readers above verify what they read
as they always do (segment blocks, table checksums from the manifest, manifest checksums
from the checkpoint metadata).

Space: the copies of one directory stay within ``budget_bytes``; when a new copy would
exceed it, the least recently used copies are deleted first. Several processes may share a
directory (the executors of one host): each copy is written under a temporary name and
renamed into place, and a copy another process evicted is simply a miss.

Layout: ``<directory>/<CRC-32 of the root URL %08x>/<object key>`` with a sidecar
``<object key>.copy`` holding ``"<size> <crc32>"`` (``docs/format.md`` section 14).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from statelog.errors import ConfigError
from statelog.layout import ObjectKind, parse_key
from statelog.store.base import ObjectInfo, ObjectStore
from statelog.store.copy_directory import (
    DEFAULT_BUDGET_BYTES,
    IMAGE_SUFFIX,
    SIDECAR,
    CopyStats,
    LocalCopies,
)

__all__ = [
    "COPIED_KINDS", "DEFAULT_BUDGET_BYTES", "DIRECTORY_ENV", "SIDECAR", "CopyStats", "LocalCopies",
    "LocalCopyStore", "default_directory", "local_copies_setting", "with_local_copies",
]  # fmt: skip


COPIED_KINDS = frozenset({
    ObjectKind.SEGMENT,
    ObjectKind.TABLE,
    ObjectKind.MANIFEST,
    ObjectKind.SAVEPOINT_TABLE,
    ObjectKind.SAVEPOINT_MANIFEST,
})


class LocalCopyStore(ObjectStore):
    """``inner`` with the immutable data objects read from local copies where they exist."""

    def __init__(self, inner: ObjectStore, copies: LocalCopies) -> None:
        self.inner = inner
        self.copies = copies
        self.url = inner.url

    def __repr__(self) -> str:
        return f"LocalCopyStore({self.inner!r}, {str(self.copies.base)!r})"

    @staticmethod
    def copied(key: str) -> bool:
        parsed = parse_key(key)
        return parsed is not None and parsed.kind in COPIED_KINDS

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)
        if self.copied(key):
            self.copies.add(key, bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        if not self.copied(key):
            return self.inner.get(key)
        stats = self.copies.stats
        local = self.copies.get(key)
        if local is not None:
            with stats._lock:
                stats.hits += 1
                stats.bytes_local += len(local)
            return local
        data = self.inner.get(key)
        with stats._lock:
            stats.misses += 1
            stats.bytes_remote += len(data)
        self.copies.add(key, data)
        return data

    def get_expected(self, key: str, size: int, crc32: int) -> bytes:
        """The copy only if it is the ``size`` bytes with ``crc32`` the referencing object
        records; a copy that is not is dropped (logged) and the object read from the store."""
        if not self.copied(key):
            return self.inner.get_expected(key, size, crc32)
        local = self.copies.get(key)
        if local is not None:
            if len(local) == size and zlib.crc32(local) == crc32:
                with self.copies.stats._lock:
                    self.copies.stats.hits += 1
                    self.copies.stats.bytes_local += len(local)
                return local
            self.copies.drop(key, f"it is {len(local)} bytes with CRC-32 {zlib.crc32(local):08x}, the object that "
                                  f"references it records {size} bytes with {crc32:08x}")  # fmt: skip
        data = self.inner.get_expected(key, size, crc32)
        with self.copies.stats._lock:
            self.copies.stats.misses += 1
            self.copies.stats.bytes_remote += len(data)
        if len(data) == size and zlib.crc32(data) == crc32:
            self.copies.add(key, data)
        return data

    @property
    def local_copies(self) -> LocalCopies:
        return self.copies

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if not self.copied(key):
            return self.inner.get_range(key, offset, length)
        stats = self.copies.stats
        local = self.copies.get_range(key, offset, length)
        if local is not None:
            with stats._lock:
                stats.hits += 1
                stats.bytes_local += len(local)
            return local
        data = self.inner.get_range(key, offset, length)
        with stats._lock:
            stats.misses += 1
            stats.bytes_remote += len(data)
        return data

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        if self.copied(key):
            self.copies.drop(key)
            self.copies.drop(key + IMAGE_SUFFIX)  # (a table's image, if it has one)

    def reopen(self) -> LocalCopyStore | None:
        """The inner store reopened, with the same copies (a background materializer's tables
        are copied for this host's next restore too)."""
        twin = self.inner.reopen()
        return None if twin is None else LocalCopyStore(twin, self.copies)

    def close(self) -> None:
        self.inner.close()


DIRECTORY_ENV = "STATELOG_LOCAL_COPIES_DIR"


def default_directory() -> Path:
    """Where local copies go unless told: ``$STATELOG_LOCAL_COPIES_DIR`` if set (e.g. one
    directory per host that all its executors share), else ``$XDG_CACHE_HOME/statelog/copies``
    (``~/.cache/statelog/copies``)."""
    if os.environ.get(DIRECTORY_ENV):
        return Path(os.environ[DIRECTORY_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "statelog" / "copies"


def local_copies_setting(setting: object, label: str = "local_copies") -> dict[str, Any] | None:
    """``setting`` checked and spelled out (``directory``, ``budget_bytes``), ``None`` for off:
    ``None``/``False``: off; ``True``: :func:`default_directory` with the default budget; a
    path: that directory; a mapping with ``directory`` and/or ``budget_bytes``. Without a
    directory, ``directory`` is ``None``: :func:`default_directory` of the process that opens
    the copies (a runtime worker on a Spark executor resolves it on its own host, not the
    driver's). Nothing is created here."""
    if setting is None or setting is False:
        return None
    directory: object = None
    budget: object = DEFAULT_BUDGET_BYTES
    if isinstance(setting, str | os.PathLike):
        directory = setting
    elif isinstance(setting, Mapping):
        unknown = set(setting) - {"directory", "budget_bytes"}
        if unknown:
            raise ConfigError(f"unknown {label} option(s) {sorted(map(str, unknown))}; use directory and budget_bytes")
        directory = setting.get("directory")
        budget = setting.get("budget_bytes", budget)
    elif setting is not True:
        raise ConfigError(
            f"{label} must be True, False, None, a directory or a dict with directory and "
            f"budget_bytes, got {type(setting).__name__}"
        )
    if directory is not None and (not isinstance(directory, str | os.PathLike) or not str(directory)):
        raise ConfigError(f"{label}' directory must be a non-empty path, got {directory!r}")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ConfigError(f"{label}' budget_bytes must be an int of bytes >= 0, got {budget!r}")
    return {"directory": None if directory is None else os.fspath(directory), "budget_bytes": budget}


def with_local_copies(store: ObjectStore, setting: object) -> ObjectStore:
    """``store`` wrapped by :class:`LocalCopyStore` as ``setting`` says (:func:`local_copies_setting`)."""
    checked = local_copies_setting(setting)
    if checked is None:
        return store
    directory = checked["directory"] if checked["directory"] is not None else default_directory()
    return LocalCopyStore(store, LocalCopies(directory, store.url, checked["budget_bytes"]))
