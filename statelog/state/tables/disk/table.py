"""The tables of a state in a disk-backed working set.

* The default namespace (keyed state without windows): a plain ``dict`` of the resident
  keys' entries (:mod:`.resident`); a restore's replay, which writes to any key, goes
  through a :class:`ResidentView` of it, which makes each key it touches resident first.
* Every other namespace (windows): a :class:`DiskTable`, a ``dict``-like cache over the
  database. Writes go to the cache and mark the entry dirty; a read that misses the cache
  reads the database and caches the entry. Entries of list and map states and of states
  with TTL are mutated in place by the states: a read of one marks it dirty too. When the
  cached entries of all tables exceed their budget, the oldest tenth of each table's cache
  is written back in one batch and dropped (:class:`NamespacedCache`).

``ws`` below is the :class:`~statelog.state.tables.disk.working_set.DiskWorkingSet` the
tables belong to (its database, state ids and figures; it imports this module).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from statelog.keys.encoding import decode_key
from statelog.state.tables.base import KeyInfo, StateTables, Table
from statelog.state.tables.disk import codec
from statelog.state.tables.disk.budget import EVICT_FRACTION, Budget, deep_size
from statelog.state.tables.disk.database import NONE_NSB, disk_key, write_batch

_TOMB: Any = object()  # a deleted entry not written back yet
_MISSING: Any = object()
# bytes of an entry in the cache beyond its key and value: its slots in the cache and dirty
# dicts (they grow by doubling) and the dirty entry's key info
_SLOT_BYTES = 120


class DiskTable:
    """The entries of one state and namespace: a ``dict``-like cache over the database."""

    __slots__ = ("ws", "owner", "sid", "nsb", "mutable", "ctx", "cache", "dirty")

    def __init__(self, ws: Any, owner: NamespacedCache, sid: int, nsb: bytes, mutable: bool, ctx: Any) -> None:
        self.ws = ws
        self.owner = owner
        self.sid = sid
        self.nsb = nsb
        self.mutable = mutable
        self.ctx = ctx
        self.cache: dict[Any, Any] = {}
        # key -> key info (type, key bytes, key group) of entries to write back
        self.dirty: dict[Any, KeyInfo] = {}

    def __repr__(self) -> str:
        return f"DiskTable(state id {self.sid}, namespace {self.nsb!r}, {len(self.cache)} cached)"

    def _info(self, key: Any) -> KeyInfo:
        ctx = self.ctx
        if key is ctx.key:
            return ctx.key_info
        return self.ws.key_info(key)

    def _load(self, key: Any) -> Any:
        """A cache miss: read the entry from the database (cached if found)."""
        ws = self.ws
        ws.misses += 1
        ws.entry_misses += 1
        ki = self._info(key)
        raw = ws.get(disk_key(self.sid, ki[2], ki[1], self.nsb))
        if raw is None:
            return _MISSING
        v = ws.loads(raw)
        self.owner.grew()  # before caching: the entry returned must not be the one written back
        self.cache[key] = v
        return v

    def write_back(self, key: Any, batch: Any) -> None:
        ki = self.dirty.pop(key, None)
        if ki is None:
            return
        dk = disk_key(self.sid, ki[2], ki[1], self.nsb)
        v = self.cache[key]
        if v is _TOMB:
            batch.delete(dk)
        else:
            batch.put(dk, codec.dumps(v, codec.PROTOCOL))

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
            self.owner.grew()
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
        ws = self.ws
        ws.flush(self)
        state = ws.state_name(self.sid)
        if state is None:
            return
        for kb, _ns, v in ws.scan(state, self.nsb):
            yield decode_key(kb), v

    def keys(self) -> Iterator[Any]:
        return (k for k, _v in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _k, v in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


class NamespacedCache:
    """The cache budget of every :class:`DiskTable` of a working set: ``cached`` entries at
    most ``budget.entries``; over it, the oldest tenth of each table's cache is written back
    in one batch and dropped."""

    def __init__(self, ws: Any, budget: Budget) -> None:
        self.ws = ws
        self.budget = budget
        self.tables: list[DiskTable] = []
        self.cached = 0

    def table(self, sid: int, nsb: bytes, mutable: bool, ctx: Any) -> DiskTable:
        t = DiskTable(self.ws, self, sid, nsb, mutable, ctx)
        self.tables.append(t)
        return t

    def grew(self) -> None:
        """One entry more is about to be cached: write back and drop old entries when over the
        budget (before the new entry is in: a state may mutate the entry it just got or set)."""
        self.cached += 1
        if self.cached > self.budget.entries:
            self.evict()

    def evict(self) -> None:
        """Write back and drop the oldest :data:`EVICT_FRACTION` of every table's cache."""
        ws = self.ws
        ws.check_open()
        batch = write_batch()
        sample: list[int] = []
        dropped = 0
        for t in self.tables:
            c = t.cache
            if not c:
                continue
            n = max(1, int(len(c) * EVICT_FRACTION)) if len(c) > 8 else len(c)
            victims = list(itertools.islice(c, n))
            for i, key in enumerate(victims):
                if i < 16:
                    v = c[key]
                    sample.append(deep_size(key) + (0 if v is _TOMB else deep_size(v)))
                t.write_back(key, batch)
                del c[key]
            dropped += len(victims)
        ws.commit(batch)
        self.cached -= dropped
        ws.evictions += 1
        b = self.budget
        if sample and not b.fixed:  # refine the estimate of an entry's bytes (moving average)
            est = sum(sample) / len(sample) + _SLOT_BYTES
            b.entry_bytes = 0.7 * b.entry_bytes + 0.3 * est
            ws.rebudget()

    def write_back(self, batch: Any, table: DiskTable | None = None) -> None:
        """Write every dirty entry (of ``table``, or of every table) into ``batch``; entries
        stay cached, except deleted ones."""
        for t in [table] if table is not None else self.tables:
            c = t.cache
            for key in list(t.dirty):
                t.write_back(key, batch)
                if c.get(key, None) is _TOMB:
                    del c[key]
                    self.cached -= 1

    def drop_key_groups(self, lo: int, hi: int) -> None:
        """Forget the cached entries of key groups ``lo..hi``."""
        for t in self.tables:
            for key in [k for k, ki in t.key_groups_cached() if lo <= ki <= hi]:
                t.cache.pop(key, None)
                t.dirty.pop(key, None)
                self.cached -= 1

    def clear(self) -> None:
        for t in self.tables:
            t.cache.clear()
            t.dirty.clear()
        self.tables.clear()


class ResidentView:
    """A state's default-namespace dict for access to any key, not only the current one
    (restore replays its changelog tail through it): every access makes the key resident
    first, so the dict holds the key's entry as stored."""

    __slots__ = ("ws", "table")

    def __init__(self, ws: Any, table: dict[Any, Any]) -> None:
        self.ws = ws
        self.table = table

    def __repr__(self) -> str:
        return f"ResidentView({len(self.table)} resident entries)"

    def if_resident(self, keys: list[Any]) -> dict[Any, Any] | None:
        """The dict itself when every key of ``keys`` is resident (a batch call after its
        prefetch), which is read and written as the per-record calls do; else ``None``."""
        return self.table if all(map(self.ws.resident.__contains__, keys)) else None

    def _admit(self, key: Any) -> None:
        ws = self.ws
        if key not in ws.resident:
            ws.admit(key, ws.key_info(key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._admit(key)
        return self.table.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._admit(key)
        return self.table[key]

    def __contains__(self, key: Any) -> bool:
        self._admit(key)
        return key in self.table

    def __setitem__(self, key: Any, value: Any) -> None:
        self._admit(key)
        self.table[key] = value

    def __delitem__(self, key: Any) -> None:
        self._admit(key)
        del self.table[key]

    def pop(self, key: Any, *default: Any) -> Any:
        self._admit(key)
        return self.table.pop(key, *default)

    def update(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        for k, v in pairs:
            self[k] = v


class DiskStateTables(StateTables):
    """A state's tables in a disk-backed working set."""

    def __init__(self, ws: Any, name: str, mutable: bool, ctx: Any) -> None:
        self.ws = ws
        self.name = name
        self.mutable = mutable
        self.ctx = ctx

    def __repr__(self) -> str:
        return f"DiskStateTables({self.name!r})"

    def new_table(self, nsb: bytes) -> Any:
        return self.ws.table(self.name, nsb, self.mutable, self.ctx)

    def restored_namespaces(self) -> Iterable[bytes]:
        return sorted(self.ws.namespaces.get(self.name, ()))

    def stored(self, tables: Mapping[bytes, Table], namespaces: Mapping[bytes, Any]) -> Iterator[tuple[Any, Any, Any]]:
        """One scan of the database, after writing the caches back."""
        ws = self.ws
        ws.flush()
        for kb, nsb, entry in ws.scan(self.name):
            yield decode_key(kb), decode_key(nsb), entry

    def replay_table_for(self, table_for: Callable[[bytes], Table]) -> Callable[[bytes], Table]:
        ws = self.ws

        def replay_table(nsb: bytes) -> Table:  # writes to keys that are not current: made resident first
            table = table_for(nsb)
            return ResidentView(ws, table) if nsb == NONE_NSB else table  # type: ignore[arg-type]

        return replay_table

    def put_rows(
        self, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any], table_for: Callable[[bytes], Table],
    ) -> None:
        """Straight into the database (the entries of each key merged into its record)."""
        self.ws.put_rows(self.name, kbs, kgs, nss, entries)
        for nsb in set(nss):
            table_for(nsb)


__all__ = ["DiskStateTables", "DiskTable", "NamespacedCache", "ResidentView"]
