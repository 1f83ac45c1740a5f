"""The directory of local copies (:class:`LocalCopies`): verified copies of one root's
write-once data objects in a directory that any number of roots share, within a size budget
for the whole directory, least recently used evicted first (of any root). The store
that serves reads from it is :class:`statelog.store.local_copies.LocalCopyStore`; the
layout is ``docs/format.md`` section 14."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from statelog.errors import ConfigError

log = logging.getLogger("statelog.store.local_copies")  # one logger for the copies and their store

SIDECAR = ".copy"
IMAGE_SUFFIX = ".image"  # a state table's decoded copy: <table key>.image (statelog.materialization.table_image)
DEFAULT_BUDGET_BYTES = 1 << 30


@dataclass
class CopyStats:
    """What the local copies saved: objects and bytes read locally vs from the store."""

    hits: int = 0
    misses: int = 0
    bytes_local: int = 0
    bytes_remote: int = 0
    copies_made: int = 0
    evictions: int = 0
    dropped: int = 0  # copies that failed verification
    skipped: int = 0  # copies not made: the disk refused them (full, read-only)
    images_made: int = 0  # decoded copies of state tables written (table images)
    image_hits: int = 0  # state tables restored from their image (also counted in hits)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


class LocalCopies:
    """The copies of one root in a directory shared by roots, within a size budget for the
    whole directory (LRU eviction across roots)."""

    def __init__(self, directory: str | os.PathLike[str], root_url: str, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
            raise ConfigError(f"the local copies' budget must be an int of bytes >= 0, got {budget_bytes!r}")
        self.directory = Path(directory)
        self._prefix = f"{zlib.crc32(root_url.encode()):08x}/"
        self.base = self.directory / self._prefix
        try:
            self.base.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"cannot use {str(directory)!r} for local copies ({e.strerror}); give a writable "
                "directory or turn local copies off"
            ) from None
        self.budget = budget_bytes
        self.stats = CopyStats()
        self._lock = threading.Lock()
        # every copy in the directory, of any root: path below the directory -> size, least
        # recently used first (the budget bounds the directory, not one root's subdirectory)
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._size = 0
        self._verified: dict[str, tuple[int, int]] = {}  # key -> (size, mtime_ns) verified whole
        for rel, size in self._scan():
            self._lru[rel] = size
            self._size += size
        # processes sharing the directory each account for what they found and what they copied
        # since: together they may have gone over the budget, which the next one to start restores
        # (copies of roots that no longer exist age out the same way)
        for victim in self._over_budget():
            self._unlink_rel(victim)

    @property
    def size_bytes(self) -> int:
        return self._size

    def figures(self) -> dict[str, int]:
        """The counters (:class:`CopyStats`) with the directory's size and budget, for metrics."""
        with self.stats._lock:
            out = self.stats.as_dict()
        return {**out, "size_bytes": self._size, "budget_bytes": self.budget}

    def _scan(self) -> Iterator[tuple[str, int]]:
        """The copies already in the directory (of every root), oldest use first."""
        found: list[tuple[int, str, int]] = []
        for dirpath, _, files in os.walk(self.directory):
            for name in files:
                if not name.endswith(SIDECAR) or name.startswith("."):  # (".": being written)
                    continue
                side = Path(dirpath) / name
                data = side.with_name(name[: -len(SIDECAR)])
                try:
                    st = data.stat()
                except FileNotFoundError:
                    side.unlink(missing_ok=True)
                    continue
                found.append((st.st_mtime_ns, data.relative_to(self.directory).as_posix(), st.st_size))
        for _, key, size in sorted(found):
            yield key, size

    def _paths(self, key: str) -> tuple[Path, Path]:
        """This root's copy of ``key`` and its record."""
        return self._rel_paths(self._prefix + key)

    def _rel_paths(self, rel: str) -> tuple[Path, Path]:
        """The copy at ``rel`` below the directory (of any root) and its record."""
        path = self.directory / rel
        return path, path.with_name(path.name + SIDECAR)

    def add(self, key: str, data: bytes) -> bool:
        """Keep a copy of ``key`` (the bytes the store holds); evict others to fit the budget.
        Returns whether the copy was made."""
        size = len(data)
        if size > self.budget:
            return False
        path, side = self._paths(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
            side_tmp = tmp.with_name(tmp.name + SIDECAR)
            side_tmp.write_text(f"{size} {zlib.crc32(data)}")
            os.replace(side_tmp, side)
        except OSError as e:  # a full or read-only disk costs speed, never correctness
            log.warning("could not keep a local copy of %s in %s (%s): the object is read from the store "
                        "next time", key, self.base, e.strerror or e)
            with self._lock:
                old = self._lru.pop(self._prefix + key, None)
                self._size -= old or 0
                self._verified.pop(key, None)
                self.stats.skipped += 1
            for leftover in (tmp, tmp.with_name(tmp.name + SIDECAR)):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
            self._unlink(key)
            return False
        with self._lock:
            old = self._lru.pop(self._prefix + key, None)
            self._size += size - (old or 0)
            self._lru[self._prefix + key] = size
            self._verified.pop(key, None)
            self.stats.copies_made += 1
            victims = self._over_budget()
        for victim in victims:
            self._unlink_rel(victim)
        return True

    def _over_budget(self) -> list[str]:
        """The least recently used copies (paths below the directory, of any root) to delete
        to come within the budget; taken out of the accounting."""
        victims = []
        while self._size > self.budget and self._lru:
            victim, vsize = self._lru.popitem(last=False)
            self._size -= vsize
            if victim.startswith(self._prefix):
                self._verified.pop(victim[len(self._prefix) :], None)
            self.stats.evictions += 1
            victims.append(victim)
        return victims

    def _unlink(self, key: str) -> None:
        self._unlink_rel(self._prefix + key)

    def _unlink_rel(self, rel: str) -> None:
        path, side = self._rel_paths(rel)
        for p in (side, path):
            try:
                p.unlink(missing_ok=True)
            except OSError as e:  # a read-only directory: the copy stays, unaccounted, until it can go
                log.warning("could not delete the local copy %s: %s", p, e.strerror or e)

    def drop(self, key: str, reason: str | None = None) -> None:
        with self._lock:
            size = self._lru.pop(self._prefix + key, None)
            if size is not None:
                self._size -= size
            self._verified.pop(key, None)
            if reason is not None:
                self.stats.dropped += 1
        if reason is not None:
            log.warning("dropped the local copy of %s in %s (%s); reading it from the store", key, self.base, reason)
        self._unlink(key)

    def _touch(self, key: str) -> None:
        rel = self._prefix + key
        with self._lock:
            if rel in self._lru:
                self._lru.move_to_end(rel)

    def _recorded(self, key: str) -> tuple[int, int] | None:
        _, side = self._paths(key)
        try:
            size, crc = side.read_text().split()
            return int(size), int(crc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self.drop(key, "its record is unreadable")
            return None

    def get(self, key: str) -> bytes | None:
        """The verified copy of ``key``, or ``None`` (no copy, or a damaged one, dropped)."""
        recorded = self._recorded(key)
        if recorded is None:
            return None
        path, _ = self._paths(key)
        try:
            data = path.read_bytes()
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:  # evicted meanwhile (by this or another process)
            self.drop(key)
            return None
        except OSError as e:
            self.drop(key, f"unreadable: {e}")
            return None
        size, crc = recorded
        if len(data) != size or zlib.crc32(data) != crc:
            self.drop(key, f"{len(data)} bytes with CRC-32 {zlib.crc32(data):08x}, recorded {size} bytes with {crc:08x}")
            return None
        with self._lock:
            self._verified[key] = (size, mtime)
        self._touch(key)
        return data

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """``length`` bytes from ``offset`` of the verified copy of ``key``, or ``None``. The
        copy is verified whole the first time this process reads from it."""
        path, _ = self._paths(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        with self._lock:
            verified = self._verified.get(key) == (st.st_size, st.st_mtime_ns)
        if not verified and self.get(key) is None:
            return None
        size = st.st_size
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(max(0, length))
        except FileNotFoundError:
            self.drop(key)
            return None
        self._touch(key)
        return data
