"""The disk-backed working set: keyed state larger than memory.

A keyed backend opened with ``state_store="disk"`` keeps its states' entries in an embedded
RocksDB database on local disk (through ``rocksdict``) under a bounded in-memory cache of hot
entries, instead of in Python dicts. Only the working set moves: the states' API and their
change records, the changelog, checkpoints, materializations and the Parquet format are the
same as with the in-memory store (Flink's changelog backend over RocksDB instead of the heap).

The directory is a local cache, never the source of truth: it is created empty when the
backend opens (a restore fills it from the checkpoint: the materialized rows in bulk, then the
changelog tail), deleted when the backend closes, never uploaded and never reused; the
directory of a process that died is deleted by the next backend that opens under the same
parent. RocksDB checks its blocks' checksums on every read: a corrupt local file fails the
task, which restarts from its last checkpoint into a fresh directory.

Layout (one database per backend)::

    key   = state id (2 bytes, big-endian) | key group (2 bytes, big-endian)
            | length of the key bytes (4 bytes, big-endian) | key bytes | namespace bytes
    value = pickle of the entry (the in-memory entry of the state kind, statelog.state.appliers)

so a state's entries of one key group are one contiguous range (dropped, iterated and bulk
loaded in key-group order). State ids are given in registration order by each backend.

The cache (:class:`DiskTable`, one per state and namespace, with the ``dict`` protocol the
states and appliers use) holds entries keyed by the key object, as the in-memory tables do.
Writes go to the cache and mark the entry dirty; when the cached entries exceed the budget,
the oldest tenth of each table's cache is written back in one batch and dropped. A read that
misses the cache reads the database and caches the entry. Entries of list and map states and
of states with TTL are mutated in place by the states: a read of one marks it dirty too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import rocksdict

from statelog.errors import ConfigError, StatelogError
from statelog.keys import decode_key, encode_key, key_group_of_bytes

log = logging.getLogger(__name__)

__all__ = ["DiskTable", "WorkingSet", "WorkingSetError", "default_state_dir"]

DIR_PREFIX = "statelog-ws-"
_TOMB: Any = object()  # a deleted entry not written back yet
_MISSING: Any = object()
_DUMPS = pickle.dumps
_LOADS = pickle.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL

# The memory budget's split: the rest (about a tenth) is left for the allocator's slack.
CACHE_SHARE = 0.55  # Python objects of cached entries
BLOCK_CACHE_SHARE = 0.20  # RocksDB's block cache
MEMTABLE_SHARE = 0.15  # RocksDB's write buffers (two of this share's halves)
EVICT_FRACTION = 0.1  # of the cached entries written back and dropped at once
MIN_CACHE_ENTRIES = 1024
# bytes of an entry in the cache beyond its key and value: its slots in the cache and dirty
# dicts (they grow by doubling) and the dirty entry's key info
_SLOT_BYTES = 120


class WorkingSetError(StatelogError):
    """The local database of a disk-backed working set failed (corrupt, I/O error, disk full)."""


def default_state_dir() -> str:
    """Where working-set directories go unless ``state_dir`` says otherwise."""
    return os.path.join(tempfile.gettempdir(), "statelog-state")


def _deep_size(obj: Any) -> int:
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: str) -> None:
    """Delete working-set directories of processes that are gone (they are never reused)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(DIR_PREFIX):
            continue
        try:
            pid = int(name[len(DIR_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            log.info("deleting the working-set directory of a process that is gone: %s", name)
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _disk_key(sid: int, kg: int, kb: bytes, nsb: bytes) -> bytes:
    return ((sid << 48) | (kg << 32) | len(kb)).to_bytes(8, "big") + kb + nsb


class WorkingSet:
    """The on-disk store and cache budget of one keyed backend's states."""

    def __init__(
        self, memory_bytes: int, directory: str | None, max_parallelism: int, label: str = "",
        cache_entries: int | None = None,
    ) -> None:
        """``cache_entries`` fixes the number of cached entries (tests) instead of deriving
        it from ``memory_bytes`` and the measured size of entries."""
        self._rocksdict = rocksdict
        self.memory_bytes = memory_bytes
        self.max_parallelism = max_parallelism
        parent = directory or default_state_dir()
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"state_dir {parent!r} cannot be created ({e.strerror}); give a writable local directory"
            ) from None
        _remove_stale(parent)
        self.path = os.path.join(parent, f"{DIR_PREFIX}{os.getpid()}-{label}{uuid.uuid4().hex[:8]}")
        os.makedirs(self.path)
        self._db = rocksdict.Rdict(self.path, self._options(memory_bytes))
        self._wopts = rocksdict.WriteOptions()
        self._wopts.disable_wal = True  # a cache rebuilt from the checkpoint: no log needed
        self._db.set_write_options(self._wopts)
        self._closed = False
        self._tables: list[DiskTable] = []
        self._states: dict[str, int] = {}
        # namespaces bulk-loaded per state (its tables are created when the state registers)
        self.namespaces: dict[str, set[bytes]] = {}
        self.cache_bytes = int(memory_bytes * CACHE_SHARE)
        self.entry_bytes = 200.0  # refined from samples at every eviction
        self._fixed = cache_entries
        self.limit = cache_entries or max(MIN_CACHE_ENTRIES, int(self.cache_bytes / self.entry_bytes))
        self.cached = 0
        # figures (stats, benchmarks)
        self.reads = 0
        self.misses = 0
        self.written_back = 0
        self.evictions = 0

    def _options(self, memory_bytes: int) -> Any:
        r = self._rocksdict
        opts = r.Options(raw_mode=True)
        opts.create_if_missing(True)
        write_buffer = max(1 << 20, int(memory_bytes * MEMTABLE_SHARE / 2))
        opts.set_write_buffer_size(write_buffer)
        opts.set_max_write_buffer_number(2)
        opts.set_max_background_jobs(2)
        opts.set_compression_type(r.DBCompressionType.lz4())
        table = r.BlockBasedOptions()
        table.set_block_cache(r.Cache(max(1 << 20, int(memory_bytes * BLOCK_CACHE_SHARE))))
        table.set_bloom_filter(10, False)  # a miss (a new key) reads no data block
        # index and filter blocks stay outside the block cache: in it, a small cache evicts them
        # and every read fetches them again (measured: 10x slower point reads)
        opts.set_block_based_table_factory(table)
        opts.set_max_open_files(256)
        # universal compaction rewrites less than leveled compaction (the cache writes back
        # at random keys all the time): measured 46k vs 40k updates/s on a Zipf workload
        opts.set_compaction_style(r.DBCompactionStyle.universal())
        opts.set_keep_log_file_num(2)
        return opts

    def __repr__(self) -> str:
        return f"WorkingSet({self.path!r}, memory={self.memory_bytes}, cached={self.cached})"

    # -- tables --------------------------------------------------------------------------------

    def state_id(self, name: str) -> int:
        sid = self._states.get(name)
        if sid is None:
            sid = self._states[name] = len(self._states) + 1
            if sid >= 1 << 16:
                raise StatelogError("a disk-backed backend holds at most 65535 states")
        return sid

    def table(self, state: str, nsb: bytes, mutable: bool, ctx: Any) -> DiskTable:
        t = DiskTable(self, self.state_id(state), nsb, mutable, ctx)
        self._tables.append(t)
        return t

    def key_info(self, key: Any) -> tuple[type, bytes, int]:
        kb = encode_key(key)
        return (type(key), kb, key_group_of_bytes(kb, self.max_parallelism))

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        try:
            return self._db.get(key)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors (corruption, I/O) are plain exceptions
            raise self._failed(e) from None

    def _write(self, batch: Any) -> None:
        try:
            self._db.write(batch)
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None

    def _failed(self, e: BaseException) -> WorkingSetError:
        return WorkingSetError(
            f"the disk-backed working set in {self.path} failed: {e}. It is a local cache of the "
            "checkpointed state: restart the job from its latest checkpoint, which rebuilds it in a "
            "new directory (check the disk under state_dir: free space, I/O errors)"
        )

    # -- the cache budget ----------------------------------------------------------------------

    def grew(self) -> None:
        """One entry more is about to be cached: write back and drop old entries when over the
        budget (before the new entry is in: a state may mutate the entry it just got or set)."""
        self.cached += 1
        if self.cached > self.limit:
            self.evict()

    def evict(self) -> None:
        """Write back and drop the oldest :data:`EVICT_FRACTION` of every table's cache."""
        self._check_open()
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        sample: list[int] = []
        dropped = 0
        for t in self._tables:
            c = t.cache
            if not c:
                continue
            n = max(1, int(len(c) * EVICT_FRACTION)) if len(c) > 8 else len(c)
            victims = list(itertools.islice(c, n))
            for i, key in enumerate(victims):
                if i < 16:
                    v = c[key]
                    sample.append(_deep_size(key) + (0 if v is _TOMB else _deep_size(v)))
                t.write_back(key, batch)
                del c[key]
            dropped += len(victims)
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)
        self.cached -= dropped
        self.evictions += 1
        if sample and not self._fixed:  # refine the estimate of an entry's bytes (moving average)
            est = sum(sample) / len(sample) + _SLOT_BYTES
            self.entry_bytes = 0.7 * self.entry_bytes + 0.3 * est
            self.limit = max(MIN_CACHE_ENTRIES, int(self.cache_bytes / self.entry_bytes))

    def flush(self, table: DiskTable | None = None) -> None:
        """Write back every dirty entry (of ``table`` or of all tables); entries stay cached."""
        self._check_open()
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        for t in [table] if table is not None else self._tables:
            c = t.cache
            for key in list(t.dirty):
                t.write_back(key, batch)
                if c.get(key, None) is _TOMB:
                    del c[key]
                    self.cached -= 1
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)

    # -- bulk paths ----------------------------------------------------------------------------

    def put_rows(self, state: str, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any]) -> None:
        """Bulk-load restored entries (materialized rows), uncached, in one write batch."""
        self._check_open()
        sid = self.state_id(state)
        self.namespaces.setdefault(state, set()).update(set(nss))
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        dk, dumps, proto = _disk_key, _DUMPS, _PROTOCOL
        for kb, kg, nsb, e in zip(kbs, kgs, nss, entries, strict=True):
            batch.put(dk(sid, kg, kb, nsb), dumps(e, proto))
        if not batch.is_empty():
            self._write(batch)

    def scan(self, state: str, nsb: bytes | None = None) -> Iterator[tuple[bytes, bytes, Any]]:
        """``(key bytes, namespace bytes, entry)`` of a state's entries on disk, in key-group
        order (flush the cache first to see its dirty entries)."""
        self._check_open()
        sid = self._states.get(state)
        if sid is None:
            return
        lo, hi = (sid << 48).to_bytes(8, "big"), ((sid + 1) << 48).to_bytes(8, "big")
        ropts = self._rocksdict.ReadOptions()
        ropts.set_iterate_upper_bound(hi)
        try:
            it = self._db.iter(ropts)
            it.seek(lo)
            while it.valid():
                k = it.key()
                n = int.from_bytes(k[4:8], "big")
                kb, ns = k[8 : 8 + n], k[8 + n :]
                if nsb is None or ns == nsb:
                    yield kb, ns, _LOADS(it.value())
                it.next()
            it.status()
        except StatelogError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None

    def drop_key_groups(self, lo: int, hi: int) -> None:
        """Delete every state's entries of key groups ``lo..hi`` (cached ones too)."""
        self._check_open()
        for t in self._tables:
            for key in [k for k, ki in t.key_groups_cached() if lo <= ki <= hi]:
                t.cache.pop(key, None)
                t.dirty.pop(key, None)
                self.cached -= 1
        for sid in self._states.values():
            self._db.delete_range(
                ((sid << 48) | (lo << 32)).to_bytes(8, "big"), ((sid << 48) | ((hi + 1) << 32)).to_bytes(8, "big")
            )

    # -- lifecycle -----------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.path):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(dirpath, f))
        return total

    def stats(self) -> dict[str, Any]:
        return {
            "cached_entries": self.cached, "cache_limit": self.limit, "entry_bytes": round(self.entry_bytes),
            "reads": self.reads, "misses": self.misses, "written_back": self.written_back,
            "evictions": self.evictions,
        }  # fmt: skip

    def _check_open(self) -> None:
        if self._closed:
            raise StatelogError("the disk-backed working set of this backend is closed")

    def close(self) -> None:
        """Close the database and delete its directory (the state lives in the checkpoints)."""
        if self._closed:
            return
        self._closed = True
        for t in self._tables:
            t.cache.clear()
            t.dirty.clear()
        self._tables.clear()
        with contextlib.suppress(Exception):
            self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)


class DiskTable:
    """The entries of one state and namespace: a ``dict``-like cache over the database."""

    __slots__ = ("ws", "sid", "nsb", "mutable", "ctx", "cache", "dirty")

    def __init__(self, ws: WorkingSet, sid: int, nsb: bytes, mutable: bool, ctx: Any) -> None:
        self.ws = ws
        self.sid = sid
        self.nsb = nsb
        self.mutable = mutable
        self.ctx = ctx
        self.cache: dict[Any, Any] = {}
        # key -> key info (type, key bytes, key group) of entries to write back
        self.dirty: dict[Any, tuple[type, bytes, int]] = {}

    def __repr__(self) -> str:
        return f"DiskTable(state id {self.sid}, namespace {self.nsb!r}, {len(self.cache)} cached)"

    def _info(self, key: Any) -> tuple[type, bytes, int]:
        ctx = self.ctx
        if key is ctx.key:
            return ctx.key_info
        return self.ws.key_info(key)

    def _load(self, key: Any) -> Any:
        """A cache miss: read the entry from the database (cached if found)."""
        ws = self.ws
        ws.misses += 1
        ki = self._info(key)
        raw = ws.get(_disk_key(self.sid, ki[2], ki[1], self.nsb))
        if raw is None:
            return _MISSING
        v = _LOADS(raw)
        ws.grew()  # before caching: the entry returned must not be the one written back
        self.cache[key] = v
        return v

    def write_back(self, key: Any, batch: Any) -> None:
        ki = self.dirty.pop(key, None)
        if ki is None:
            return
        dk = _disk_key(self.sid, ki[2], ki[1], self.nsb)
        v = self.cache[key]
        if v is _TOMB:
            batch.delete(dk)
        else:
            batch.put(dk, _DUMPS(v, _PROTOCOL))

    def key_groups_cached(self) -> list[tuple[Any, int]]:
        return [(k, self._info(k)[2]) for k in self.cache]

    # -- the dict protocol the states and appliers use ----------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            v = self.cache[key]
        except KeyError:
            v = self._load(key)
            if v is _MISSING:
                return default
        if v is _TOMB:
            return default
        if self.mutable:  # the caller may mutate the entry in place
            ctx = self.ctx
            self.dirty[key] = ctx.key_info if key is ctx.key else self.ws.key_info(key)
        return v

    def __getitem__(self, key: Any) -> Any:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __contains__(self, key: Any) -> bool:
        try:
            v = self.cache[key]
        except KeyError:
            v = self._load(key)
        return v is not _MISSING and v is not _TOMB

    def __setitem__(self, key: Any, value: Any) -> None:
        c = self.cache
        if key not in c:
            # make room first: the caller may go on mutating ``value`` (a new list or map)
            self.ws.grew()
        c[key] = value
        ctx = self.ctx  # _info() inlined: this runs once per update
        self.dirty[key] = ctx.key_info if key is ctx.key else self.ws.key_info(key)

    def __delitem__(self, key: Any) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        try:
            v = self.cache[key]
        except KeyError:
            v = self._load(key)
        if v is _MISSING or v is _TOMB:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self.cache[key] = _TOMB
        self.dirty[key] = self._info(key)
        return v

    def update(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        for k, v in pairs:
            self[k] = v

    def __bool__(self) -> bool:
        return True  # unknown without a scan: the state never drops a disk table as empty

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every entry (written back first), decoded keys, in key-group order."""
        self.ws.flush(self)
        state = next((n for n, s in self.ws._states.items() if s == self.sid), None)
        if state is None:
            return
        for kb, _ns, v in self.ws.scan(state, self.nsb):
            yield decode_key(kb), v

    def keys(self) -> Iterator[Any]:
        return (k for k, _v in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _k, v in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())
