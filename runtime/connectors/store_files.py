"""Source files below an ``s3://`` URL, read through statelog's store layer.

A job on a cluster reads its input where every node can reach it. ``ParquetSource`` takes an
``s3://bucket/prefix`` directory: its files are the objects directly below the prefix whose
names match the pattern; each is read as a seekable file (:class:`StoreFile`) whose reads
are ranged GETs, so a reader fetches the footer and the row groups it reads, never the
whole object. The store options (endpoint, region, credentials) are resolved where the
source is built (``AWS_*`` of that process included) and travel with the pickled source.
"""

from __future__ import annotations

import fnmatch
import io
from collections.abc import Mapping
from typing import Any

from runtime.errors import JobGraphError
from statelog.store import open_store
from statelog.store.base import ObjectStore
from statelog.store.options import StoreOptions, resolve_store_options

REMOTE_SCHEMES = ("s3://",)


def is_remote(directory: str) -> bool:
    return directory.lower().startswith(REMOTE_SCHEMES)


def source_store_options(kind: str, directory: str, options: Mapping[str, Any] | None) -> StoreOptions | None:
    """The resolved store options of a remote directory (None for a local one)."""
    if is_remote(directory):
        return resolve_store_options(directory, options)
    if options:
        raise JobGraphError(f"{kind} store_options apply to s3:// directories only, not to {directory!r}")
    return None


def list_names(store: ObjectStore, pattern: str) -> list[str]:
    """The names of the objects directly below the store's root that match ``pattern``."""
    return sorted(o.key for o in store.list("") if "/" not in o.key and fnmatch.fnmatchcase(o.key, pattern))


class StoreFile(io.RawIOBase):
    """A read-only, seekable file over one object (reads are ranged GETs)."""

    def __init__(self, store: ObjectStore, key: str, url: str, own_store: bool = False) -> None:
        super().__init__()
        self.store, self.key, self.url, self._own = store, key, url, own_store
        info = store.head(key)
        if info is None:
            raise FileNotFoundError(f"{url} does not exist")
        self.size = info.size
        self._pos = 0

    def __repr__(self) -> str:
        return f"StoreFile({self.url!r})"

    __str__ = __repr__

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self._pos)
        if n <= 0:
            return 0
        data = self.store.get_range(self.key, self._pos, n)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed and self._own:
            self.store.close()
        super().close()


def open_store_file(directory: str, options: Mapping[str, Any] | None, name: str) -> StoreFile:
    """Object ``name`` below ``directory`` as a file with a store of its own (closed with it)."""
    store = open_store(directory, options)
    try:
        return StoreFile(store, name, f"{directory.rstrip('/')}/{name}", own_store=True)
    except BaseException:
        store.close()
        raise
