"""A store whose writes stop for good once the process lost its job root.

The process that holds a root's writer lease (:mod:`statelog.checkpoint.writer_lease`) reaches the
store through a :class:`FencedStore`: every ``put``, ``put_if_absent`` and ``delete`` first
calls ``check`` (:meth:`WriterLease.check_writable`), which raises the lease's
:class:`~statelog.errors.FencedError` once the lease was lost or its deadline passed. Reads
are passed through unchanged. The lease's own objects are written through the inner store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from statelog.store.base import ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from statelog.store.copy_directory import LocalCopies


class FencedStore(ObjectStore):
    """``inner`` with every write checked by ``check`` (which raises to refuse it)."""

    def __init__(self, inner: ObjectStore, check: Callable[[], None]) -> None:
        self.inner = inner
        self.check = check
        self.url = inner.url

    def __repr__(self) -> str:
        return repr(self.inner)

    def put(self, key: str, data: bytes) -> None:
        self.check()
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.check()
        return self.inner.put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self.check()
        self.inner.delete(key)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_expected(self, key: str, size: int, crc32: int) -> bytes:
        return self.inner.get_expected(key, size, crc32)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self.inner.get_range(key, offset, length)

    @property
    def local_copies(self) -> LocalCopies | None:
        return self.inner.local_copies

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def close(self) -> None:
        self.inner.close()

    def reopen(self) -> FencedStore | None:
        """The inner store reopened, fenced by the same check (the same lease)."""
        twin = self.inner.reopen()
        return None if twin is None else FencedStore(twin, self.check)
