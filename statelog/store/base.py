"""The narrow object-store interface every persisted byte goes through.

Implementations: :mod:`statelog.store.local` (``file://``, the embedded default) and
:mod:`statelog.store.s3` (``s3://bucket/prefix`` through the minio SDK). Callers obtain a
store with :func:`statelog.store.open_store` and never import an implementation. Tests
wrap a real store with :class:`statelog.testing.FaultInjectingStore`.

Keys are relative, ``/``-separated paths below the store's root (no leading ``/``, no
``..`` segments, no empty segments).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statelog.store.copy_directory import LocalCopies


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch (last modification / upload time)


class ObjectStore(abc.ABC):
    """Write-once object storage below one root URL."""

    url: str  # the root URL with any credentials removed (safe to log)

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, durably, write-once.

        If an object already exists under ``key`` with identical bytes, this is a
        no-op (so retries are idempotent); with different bytes it raises
        :class:`~statelog.errors.ObjectExistsError`. When it returns, the object is durable.
        """

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Atomically create ``key`` with ``data`` unless an object exists under it.

        Returns ``True`` if this call created the object (durable when it returns),
        ``False`` if an object already existed under ``key``, whatever its content. Of
        several concurrent callers on one key exactly one gets ``True``. Unlike
        :meth:`put` it never compares content on the first attempt: an existing object
        means somebody else created it. Only when an implementation *retries* a request
        whose outcome was unknown does it compare bytes, and then identical bytes count as
        its own creation, so callers that need to know who won must make ``data`` unique
        to the writer (an owner id, a nonce).

        The default raises ``NotImplementedError``: a store without an atomic
        create-if-absent must not pretend to have one (see ``docs/store.md``).
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement an atomic put_if_absent"
        )

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Return the whole object; :class:`~statelog.errors.ObjectNotFoundError` if absent."""

    def get_expected(self, key: str, size: int, crc32: int) -> bytes:
        """``get(key)`` of an object whose size and CRC-32 the referencing object records (a
        manifest's table file). The caller still checks them; a store that keeps local copies
        (``statelog.store.local_copies``) serves its copy only if it matches them, else drops
        it and reads the store."""
        return self.get(key)

    @property
    def local_copies(self) -> LocalCopies | None:
        """The local copies this store serves reads from (``statelog.store.local_copies``),
        if any: where decoded copies of state tables (table images) are kept too."""
        return None

    @abc.abstractmethod
    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Return ``length`` bytes from ``offset`` (fewer only at the end of the object).

        A negative ``offset`` counts from the end (``offset=-n, length=n`` reads the last
        ``n`` bytes).
        """

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Return the object's info, or ``None`` if it does not exist."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object; deleting a missing object is not an error."""

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def reopen(self) -> ObjectStore | None:
        """A separate handle on the same root (its own connections, closed by the caller), or
        ``None`` if this store cannot be reopened (the default: a wrapper such as a fault
        injector, which callers then share)."""
        return None

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
