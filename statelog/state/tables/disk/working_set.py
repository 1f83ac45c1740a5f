"""The disk-backed working set of one keyed backend: its states' entries in a local database.

:class:`DiskWorkingSet` owns the database (:mod:`.database`, in a directory of its own,
:mod:`.directories`), gives each state an id and its tables (:mod:`.table`), and holds the
two caches over the database, the resident keys (:mod:`.resident`) and the namespaced
entries (:class:`~.table.NamespacedCache`), under one budget (:mod:`.budget`). It also
bulk-loads a restore's entries, scans a state's entries and drops key groups. RocksDB's
errors (corruption, I/O, disk full) become :class:`WorkingSetError`, which says to restart
from the checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from statelog.errors import StatelogError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes
from statelog.state.tables.base import KeyInfo, KeySetter, WorkingSet
from statelog.state.tables.disk import codec, miss_path
from statelog.state.tables.disk.budget import Budget
from statelog.state.tables.disk.database import (
    NONE_NSB,
    open_database,
    read_options,
    split_key,
    write_batch,
)
from statelog.state.tables.disk.directories import new_directory
from statelog.state.tables.disk.resident import ResidentKeys
from statelog.state.tables.disk.table import DiskStateTables, DiskTable, NamespacedCache

_MISSING: Any = object()


class WorkingSetError(StatelogError):
    """The local database of a disk-backed working set failed (corrupt, I/O error, disk full)."""


class DiskWorkingSet(WorkingSet):
    """The on-disk store and cache budget of one keyed backend's states."""

    on_disk: ClassVar[bool] = True

    def __init__(
        self, memory_bytes: int, directory: str | None, max_parallelism: int, label: str = "",
        cache_entries: int | None = None,
    ) -> None:
        """``cache_entries`` fixes the number of cached entries (tests) instead of deriving
        it from ``memory_bytes`` and the measured size of entries."""
        self.memory_bytes = memory_bytes
        self.max_parallelism = max_parallelism
        self.path = new_directory(directory, label)
        self._db = open_database(self.path, memory_bytes)
        self._closed = False
        self._states: dict[str, int] = {}
        # namespaces bulk-loaded per state (its tables are created when the state registers)
        self.namespaces: dict[str, set[bytes]] = {}
        self.budget = Budget(memory_bytes, cache_entries)
        self.resident_keys = ResidentKeys(self, self.budget)
        self.namespaced = NamespacedCache(self, self.budget)
        # the resident keys are the backend's key cache (its key setter makes a key resident
        # through admit()); touched: resident keys used again, spared once by an eviction
        self.key_cache = self.resident = self.resident_keys.resident
        self.touched = self.resident_keys.touched
        # figures (stats, benchmarks)
        self.prefetched = 0
        self.reads = 0
        self.misses = 0  # database reads: keys (admitted or prefetched) and namespaced entries
        self.entry_misses = 0  # ... of them namespaced entries
        self._hits = 0  # the key hits last reported (key_hits() never goes back)
        self.written_back = 0
        self.evictions = 0

    def __repr__(self) -> str:
        return f"DiskWorkingSet({self.path!r}, memory={self.memory_bytes}, cached={self.cached})"

    @property
    def cached(self) -> int:
        """Entries in the namespaced tables' caches."""
        return self.namespaced.cached

    # -- the working set of a backend -----------------------------------------------------------

    def attach(self, ctx: Any) -> None:
        ctx.working_set = self
        self.resident_keys.key_context = ctx  # its current key is never evicted

    def state_tables(self, name: str, mutable: bool, ctx: Any) -> DiskStateTables:
        return DiskStateTables(self, name, mutable, ctx)

    def key_setter(self, ctx: Any, slow: KeySetter) -> KeySetter:
        return self.resident_keys.key_setter(ctx, slow)

    def admit(self, key: Any, info: KeyInfo) -> None:
        """Make ``key`` resident (:meth:`.ResidentKeys.admit`)."""
        self.resident_keys.admit(key, info)

    def prefetch(self, keys: Iterable[Any], lo: int, hi: int) -> int:
        """Make ``keys`` resident with one batched read (:meth:`.ResidentKeys.prefetch`)."""
        return self.resident_keys.prefetch(keys, lo, hi)

    # -- states and their tables ------------------------------------------------------------------

    def state_id(self, name: str) -> int:
        sid = self._states.get(name)
        if sid is None:
            sid = self._states[name] = len(self._states) + 1
            if sid >= 1 << 16:
                raise StatelogError("a disk-backed backend holds at most 65535 states")
        return sid

    def state_name(self, sid: int) -> str | None:
        return next((n for n, s in self._states.items() if s == sid), None)

    def table(self, state: str, nsb: bytes, mutable: bool, ctx: Any) -> Any:
        """The table of a state's entries in namespace ``nsb``: a plain dict of resident keys
        for the default namespace, a :class:`DiskTable` for the others."""
        sid = self.state_id(state)
        if nsb == NONE_NSB:
            return self.resident_keys.register(sid, ctx)
        return self.namespaced.table(sid, nsb, mutable, ctx)

    def key_info(self, key: Any) -> KeyInfo:
        kb = encode_key(key)
        return (type(key), kb, key_group_of_bytes(kb, self.max_parallelism))

    # -- the database ------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        self.check_open()
        try:
            return self._db.get(key)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors (corruption, I/O) are plain exceptions
            raise self.failed(e) from None

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        try:
            return self._db.get(keys)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors are plain exceptions
            raise self.failed(e) from None

    def loads(self, raw: bytes) -> Any:
        """The value of a database value's bytes (a value that does not parse fails the task)."""
        try:
            return codec.loads(raw)
        except Exception as e:  # noqa: BLE001 - ValueError, or a broken pickle's error
            raise self.failed(e) from None

    def _write(self, batch: Any) -> None:
        try:
            self._db.write(batch)
        except Exception as e:  # noqa: BLE001
            raise self.failed(e) from None

    def commit(self, batch: Any) -> None:
        """Write a batch of entries written back from the caches (counted)."""
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)

    def failed(self, e: BaseException) -> WorkingSetError:
        return WorkingSetError(
            f"the disk-backed working set in {self.path} failed: {e}. It is a local cache of the "
            "checkpointed state: restart the job from its latest checkpoint, which rebuilds it in a "
            "new directory (check the disk under state_dir: free space, I/O errors)"
        )

    def check_open(self) -> None:
        if self._closed:
            raise StatelogError("the disk-backed working set of this backend is closed")

    # -- the caches ----------------------------------------------------------------------------

    def rebudget(self) -> None:
        """Split the cache budget between resident keys and namespaced entries by their use."""
        self.budget.split(self.namespaced.cached, len(self.resident))

    def release(self) -> None:
        """Write back every resident key's entries and drop them all."""
        self.resident_keys.release()

    def evict(self) -> None:
        """Write back and drop the oldest tenth of every namespaced table's cache."""
        self.namespaced.evict()

    def flush(self, table: DiskTable | None = None) -> None:
        """Write back every dirty entry (of ``table``, or of all tables and every resident
        key); entries stay cached and keys resident."""
        self.check_open()
        batch = write_batch()
        if table is None:
            self.resident_keys.write_back(list(self.resident), batch, False)
        self.namespaced.write_back(batch, table)
        self.commit(batch)

    # -- bulk paths ----------------------------------------------------------------------------

    def put_key_group(self, kg: int, rows: dict[str, list[tuple[list[bytes], list[bytes], list[Any]]]]) -> None:
        """Bulk-load the restored entries of one key group, or of a part of it (a slice, or the
        rest after slices), of every state (``state name -> [(key bytes, namespace bytes,
        entries)]``), uncached, in one write batch. Their keys hold nothing in the database
        yet (each key's restored entries are loaded once, before the key is set current)."""
        self.check_open()
        batch = write_batch()
        records: dict[bytes, dict[int, Any]] = {}
        dumps, proto, none, key_prefix = codec.dumps, codec.PROTOCOL, NONE_NSB, miss_path.key_prefix
        for state, parts in rows.items():
            sid = self.state_id(state)
            sidb = sid.to_bytes(2, "big")
            seen = self.namespaces.setdefault(state, set())
            for kbs, nss, entries in parts:
                seen.update(set(nss))
                for kb, nsb, e in zip(kbs, nss, entries, strict=True):
                    if nsb == none:
                        rec = records.get(kb)
                        if rec is None:
                            records[kb] = {sid: e}
                        else:
                            rec[sid] = e
                    else:
                        batch.put(key_prefix(kg, kb) + sidb + nsb, dumps(e, proto))
        for kb, rec in records.items():
            batch.put(key_prefix(kg, kb), dumps(rec, proto))
        if not batch.is_empty():
            self._write(batch)

    def put_rows(self, state: str, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any]) -> None:
        """Bulk-load restored entries of one state (merged into the records of their keys:
        a read per key; a restore by key group uses :meth:`put_key_group`)."""
        self.check_open()
        sid = self.state_id(state)
        sidb = sid.to_bytes(2, "big")
        self.namespaces.setdefault(state, set()).update(set(nss))
        batch = write_batch()
        records: dict[bytes, dict[int, Any]] = {}
        dumps, proto = codec.dumps, codec.PROTOCOL
        for kb, kg, nsb, e in zip(kbs, kgs, nss, entries, strict=True):
            pre = miss_path.key_prefix(kg, kb)
            if nsb != NONE_NSB:
                batch.put(pre + sidb + nsb, dumps(e, proto))
                continue
            rec = records.get(pre)
            if rec is None:
                raw = self.get(pre)
                rec = records[pre] = self.loads(raw) if raw is not None else {}
            rec[sid] = e
        for pre, rec in records.items():
            batch.put(pre, dumps(rec, proto))
        if not batch.is_empty():
            self._write(batch)

    def scan(self, state: str, nsb: bytes | None = None) -> Iterator[tuple[bytes, bytes, Any]]:
        """``(key bytes, namespace bytes, entry)`` of a state's entries on disk, in key-group
        order (flush the cache first to see its dirty entries)."""
        self.check_open()
        sid = self._states.get(state)
        if sid is None:
            return
        loads = codec.loads
        try:
            it = self._db.iter(read_options())
            it.seek_to_first()
            while it.valid():
                _kg, kb, s, ns = split_key(it.key())
                if s == 0:  # a key's record: its default-namespace entries by state id
                    if nsb is None or nsb == NONE_NSB:
                        e = loads(it.value()).get(sid, _MISSING)
                        if e is not _MISSING:
                            yield kb, NONE_NSB, e
                elif s == sid and (nsb is None or ns == nsb):
                    yield kb, ns, loads(it.value())
                it.next()
            it.status()
        except StatelogError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self.failed(e) from None

    def drop_key_groups(self, lo: int, hi: int) -> None:
        """Delete every state's entries of key groups ``lo..hi`` (cached ones too)."""
        self.check_open()
        self.namespaced.drop_key_groups(lo, hi)
        self.resident_keys.drop_key_groups(lo, hi)
        try:
            self._db.delete_range(lo.to_bytes(2, "big"), (hi + 1).to_bytes(2, "big"))
        except Exception as e:  # noqa: BLE001
            raise self.failed(e) from None

    # -- lifecycle -----------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.path):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(dirpath, f))
        return total

    def key_hits(self) -> int:
        """Keys set current that were resident, not counting the first use of a key a prefetch
        read (that read is its miss). The key setter counts every resident key; the prefetched
        keys (``prefetched``) are subtracted, each assumed used once, as the batch loops that
        prefetch use every key they prefetch. Never decreases (a counter), also while a
        prefetched batch has not been processed yet."""
        self._hits = max(self._hits, self.resident_keys.resident_hits() - self.prefetched)
        return self._hits

    def stats(self) -> dict[str, Any]:
        b = self.budget
        return {
            "cached_entries": self.cached, "cache_limit": b.entries, "entry_bytes": round(b.entry_bytes),
            "resident_keys": len(self.resident), "resident_limit": b.keys,
            "resident_key_bytes": round(b.key_bytes),
            "reads": self.reads, "key_hits": self.key_hits(), "misses": self.misses, "prefetched": self.prefetched, "written_back": self.written_back,
            "evictions": self.evictions,
        }  # fmt: skip

    def close(self) -> None:
        """Close the database and delete its directory (the state lives in the checkpoints)."""
        if self._closed:
            return
        self._closed = True
        self.namespaced.clear()
        self.resident_keys.clear()
        with contextlib.suppress(Exception):
            self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)


__all__ = ["DiskWorkingSet", "WorkingSetError"]
