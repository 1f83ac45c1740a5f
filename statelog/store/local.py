"""Object store on the local filesystem (``file://`` job roots, the embedded default).

Each object is one regular file ``<root>/<key>``. A put is atomic and write-once:

1. write the bytes to a temporary file ``.tmp-*`` in the target directory, flush, fsync;
2. ``os.link`` it to the final name, which fails with ``EEXIST`` if the object exists
   (never overwrites, unlike ``rename``); on ``EEXIST`` the stored bytes are compared:
   identical means the put was already done (idempotent retry), different is an error;
   ``put_if_absent`` instead reports ``False`` on ``EEXIST`` (it never compares: the
   local store does not retry, so an existing object is always somebody else's);
3. unlink the temporary file and fsync the directory, so the new entry survives a crash.

New directories are created one by one and their parents fsynced. Listing skips the
``.tmp-*`` files a crash may leave behind. Every operation is a single filesystem call
sequence without shared in-process state, so the store is safe to use from many threads
(and many processes).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from statelog.errors import (
    ConfigError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreError,
    StorePermissionError,
)
from statelog.store.base import ObjectInfo, ObjectStore
from statelog.store.validation import validate_key, validate_prefix, validate_range

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
_READ_CHUNK = 1 << 20
_DIR_RACE_ATTEMPTS = 50


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_exactly(f: BinaryIO, length: int) -> bytes:
    parts: list[bytes] = []
    remaining = length
    while remaining > 0:
        chunk = f.read(min(remaining, _READ_CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _temp_file(directory: Path) -> tuple[int, str]:
    """A new file ``TEMP_PREFIX<random>`` in ``directory``, opened for writing (as
    ``tempfile.mkstemp``, without importing it: a process's start pays no ``shutil``)."""
    for _ in range(100):
        name = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(8).hex()}")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {directory}")


class LocalObjectStore(ObjectStore):
    """Write-once objects as files below ``root_dir`` (created on first put)."""

    def __init__(self, root_dir: str | os.PathLike[str]) -> None:
        root = Path(os.path.abspath(os.fspath(root_dir)))
        if root.exists() and not root.is_dir():
            raise ConfigError(
                f"job root {root} exists but is not a directory; choose a directory path"
            )
        self.root = root
        self.url = root.as_uri()

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.url!r})"

    def reopen(self) -> LocalObjectStore:
        return LocalObjectStore(self.root)

    # -- helpers -------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        validate_key(key)
        if any(segment.startswith(TEMP_PREFIX) for segment in key.split("/")):
            raise ConfigError(
                f"object key {key!r} has a segment starting with {TEMP_PREFIX!r}, which the "
                "local store reserves for temporary files; choose another name"
            )
        return self.root.joinpath(*key.split("/"))

    def _error(self, action: str, key: str, exc: OSError) -> StoreError:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            need = "read" if action in ("read", "list") else "write"
            return StorePermissionError(
                f"permission denied: could not {action} object {key!r} in {self.url}: "
                f"{exc.strerror or exc} (errno {exc.errno}); this process needs {need} "
                f"permission on {self._path(key).parent} (a read-only directory or file system "
                "cannot hold a job root that is written)",
                key=key,
            )
        return StoreError(
            f"could not {action} object {key!r} in {self.url}: {exc.strerror or exc} "
            f"(errno {exc.errno})",
            key=key,
        )

    def _ensure_dir(self, directory: Path) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry's parent.

        Raises ``FileNotFoundError`` when a concurrent delete pruned a parent meanwhile
        (the caller retries) and ``FileExistsError`` when an object is in the way.
        """
        if directory.is_dir():
            return
        if directory.parent != directory:
            self._ensure_dir(directory.parent)
        try:
            os.mkdir(directory)
        except FileExistsError:
            if directory.is_dir():
                return  # created concurrently by another writer
            if os.path.isfile(directory):
                raise  # an object is in the way
            raise FileNotFoundError(errno.ENOENT, "directory vanished", str(directory)) from None
        _fsync_dir(str(directory.parent))

    # -- ObjectStore -----------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        data = self._check_bytes("put", key, data)
        for _ in range(_DIR_RACE_ATTEMPTS):
            if self._create(key, path, data):
                return
            try:
                self._check_same(key, path, data)
                return
            except FileNotFoundError:
                continue  # the existing object was deleted meanwhile: create it again
        raise StoreError(
            f"could not write object {key!r} in {self.url}: it kept being deleted and "
            "re-created concurrently",
            key=key,
        )

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        data = self._check_bytes("put_if_absent", key, data)
        created = self._create(key, path, data)
        if not created:
            if path.is_dir():
                raise self._prefix_conflict(key)
            logger.debug("put_if_absent %s/%s: an object already exists", self.url, key)
        return created

    @staticmethod
    def _check_bytes(op: str, key: str, data: bytes) -> bytes:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"{op}() needs bytes for {key!r}, got {type(data).__name__}")
        return bytes(data)

    def _prefix_conflict(self, key: str) -> StoreError:
        return StoreError(
            f"cannot create object {key!r} in {self.url}: it is already a prefix of other "
            "objects, and a key cannot be both an object and a prefix",
            key=key,
        )

    def _create(self, key: str, path: Path, data: bytes) -> bool:
        """Create ``path`` atomically; ``True`` if created, ``False`` if the name exists."""
        try:
            attempt = 1
            while True:
                try:
                    self._ensure_dir(path.parent)
                    return self._link_new(key, path, data)
                except FileNotFoundError:
                    # A concurrent delete of the directory's last object pruned it; redo.
                    if attempt >= _DIR_RACE_ATTEMPTS:
                        raise
                    attempt += 1
        except (FileExistsError, NotADirectoryError) as exc:
            raise StoreError(
                f"cannot create object {key!r} in {self.url}: a parent of it is an object, "
                "and a key cannot be both an object and a prefix of other keys",
                key=key,
            ) from exc
        except OSError as exc:
            raise self._error("write", key, exc) from exc

    def _link_new(self, key: str, path: Path, data: bytes) -> bool:
        """Write a fsynced temp file and hard-link it to ``path`` (fails if it exists).

        Returns ``False`` when the name already exists (file or directory), ``True`` once
        the new entry is durable.
        """
        fd, tmp = _temp_file(path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                    raise StoreError(
                        f"the filesystem of {self.url} does not support hard links, which the "
                        "local store needs for atomic write-once puts; use another directory",
                        key=key,
                    ) from exc
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        # The directory holds the new object, so only a concurrent delete of that very
        # object can have pruned it; the object was created either way.
        with contextlib.suppress(FileNotFoundError):
            _fsync_dir(str(path.parent))
        return True

    def _check_same(self, key: str, path: Path, data: bytes) -> None:
        if path.is_dir():
            raise self._prefix_conflict(key)
        try:
            existing = path.read_bytes()
        except FileNotFoundError:
            raise  # deleted concurrently; the caller creates it again
        except OSError as exc:
            raise self._error("read", key, exc) from exc
        if existing != data:
            raise ObjectExistsError(
                f"object {key!r} already exists in {self.url} with different content "
                f"({len(existing)} bytes stored, {len(data)} bytes given); objects are "
                "write-once, write the new data under a new key",
                key=key,
            )
        logger.debug("put %s/%s: identical object already present, no-op", self.url, key)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise self._not_found(key) from exc
        except OSError as exc:
            raise self._error("read", key, exc) from exc

    def _not_found(self, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"object {key!r} not found in {self.url}", key=key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        validate_range(key, offset, length)
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = offset if offset >= 0 else max(0, size + offset)
                if length == 0 or start >= size:
                    return b""
                f.seek(start)
                return _read_exactly(f, length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise self._not_found(key) from exc
        except OSError as exc:
            raise self._error("read", key, exc) from exc

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._error("stat", key, exc) from exc
        if not path.is_file():
            return None
        return ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        # Walk the deepest directory that contains every match, then sort: directory order
        # is not key order ('a-b' sorts before 'a/b').
        base_parts = prefix.split("/")[:-1]
        base = self.root.joinpath(*base_parts)
        found: list[ObjectInfo] = []
        if base.is_dir():
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)]
                rel_dir = os.path.relpath(dirpath, self.root)
                for name in filenames:
                    if name.startswith(TEMP_PREFIX):
                        continue
                    key = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                    if not key.startswith(prefix):
                        continue
                    try:
                        st = os.stat(os.path.join(dirpath, name))
                    except FileNotFoundError:
                        continue  # deleted while listing
                    found.append(ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime))
        found.sort(key=lambda info: info.key)
        return iter(found)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # a prefix, not an object
        except OSError as exc:
            if exc.errno == errno.EISDIR or (exc.errno == errno.EPERM and path.is_dir()):
                return
            raise self._error("delete", key, exc) from exc
        self._prune_empty_dirs(path.parent)

    def _prune_empty_dirs(self, directory: Path) -> None:
        """Remove now-empty parent directories up to (not including) the root; best effort."""
        while directory != self.root and self.root in directory.parents:
            try:
                os.rmdir(directory)
            except OSError:
                return  # not empty (or already gone, or concurrently refilled)
            directory = directory.parent
