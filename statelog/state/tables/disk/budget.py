"""The memory budget of a disk-backed working set, split between its two caches.

Of ``state_memory`` bytes, RocksDB's write buffers take their share (:mod:`.database`), the
Python objects of the resident keys and of the cached namespaced entries take
:data:`CACHE_SHARE` (plus what the write buffers leave of theirs), and the rest (about an
eighth) is left for the allocator's slack. The caches' share is split between them by
their use: the bytes of a resident key and of a cached entry are estimated from samples
taken at every eviction, and each cache's limit (in keys, in entries) is what the other
leaves.
"""

from __future__ import annotations

import sys
from typing import Any

from statelog.state.tables.disk.database import MEMTABLE_SHARE, write_buffer

CACHE_SHARE = 0.72  # Python objects of resident keys and cached entries
EVICT_FRACTION = 0.1  # of a cache written back and dropped at once
MIN_CACHE_ENTRIES = 1024


def deep_size(obj: Any) -> int:
    """Approximate bytes of an entry's objects (containers one level deep, and TTL pairs)."""
    n = sys.getsizeof(obj)
    if isinstance(obj, list):
        for e in obj:
            n += sys.getsizeof(e)
            if isinstance(e, list):
                n += sum(sys.getsizeof(x) for x in e)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            n += sys.getsizeof(k) + sys.getsizeof(v)
            if isinstance(v, list):
                n += sum(sys.getsizeof(x) for x in v)
    return n


class Budget:
    """The limits of the two caches: ``keys`` resident keys, ``entries`` cached entries.

    ``fixed`` (tests) fixes both limits instead of deriving them from ``memory_bytes`` and
    the measured sizes."""

    def __init__(self, memory_bytes: int, fixed: int | None = None) -> None:
        # the Python objects' share, and what the write buffers leave of theirs
        self.bytes = max(0, int(memory_bytes * (CACHE_SHARE + MEMTABLE_SHARE)) - 2 * write_buffer(memory_bytes))
        self.fixed = fixed
        self.entry_bytes = 200.0  # refined from samples at every eviction
        self.key_bytes = 400.0  # refined from samples at every eviction
        self.entries = fixed or max(MIN_CACHE_ENTRIES, int(self.bytes / self.entry_bytes))
        self.keys = fixed or max(MIN_CACHE_ENTRIES, int(self.bytes / self.key_bytes))

    def __repr__(self) -> str:
        return f"Budget({self.bytes} bytes: {self.keys} resident keys, {self.entries} cached entries)"

    def split(self, cached: int, resident: int) -> None:
        """Split the bytes again, with ``cached`` entries and ``resident`` keys in the caches."""
        if self.fixed:
            return
        left = self.bytes - cached * self.entry_bytes
        self.keys = max(MIN_CACHE_ENTRIES, int(left / self.key_bytes))
        left = self.bytes - resident * self.key_bytes
        self.entries = max(MIN_CACHE_ENTRIES, int(left / self.entry_bytes))


__all__ = ["CACHE_SHARE", "EVICT_FRACTION", "MIN_CACHE_ENTRIES", "Budget", "deep_size"]
