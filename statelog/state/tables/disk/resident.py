"""The resident keys of a disk-backed working set: the hot keys' default-namespace entries.

Each state's default-namespace table is a plain ``dict``, as in memory, holding the entries
of the *resident* keys only, so the states and the C update path work on dicts exactly as
with the in-memory store. The resident keys are the backend's key cache: a key set current
that is not resident has its record (its entries of every state, one database read) read
into the dicts first (:meth:`ResidentKeys.admit`), or a batch of keys is read at once
(:meth:`ResidentKeys.prefetch`). When they exceed their budget, a tenth of them, chosen
oldest first with a second chance for keys used again (CLOCK), are written back in one
batch (every entry they have: a plain dict does not tell which changed; an entry removed
since it was read is deleted) and dropped from the dicts.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable
from typing import Any

from statelog.keys.encoding import encode_key
from statelog.state.tables.base import KeyInfo, KeySetter, unhashable_key
from statelog.state.tables.disk import codec, miss_path
from statelog.state.tables.disk.budget import EVICT_FRACTION, Budget, deep_size
from statelog.state.tables.disk.database import write_batch

_MISSING: Any = object()

PROBE_KEYS = 4096  # resident keys at which their size is first measured
# bytes of a resident key beyond its key, key bytes and entries: its key info tuple and its
# slots in the resident, presence and touched sets and dicts and in each state's dict (grown by doubling)
_RESIDENT_BYTES = 190
_ENTRY_SLOT_BYTES = 70


class ResidentKeys:
    """The resident keys of one working set and the states' default-namespace dicts.

    ``ws`` is the :class:`~statelog.state.tables.disk.working_set.DiskWorkingSet` that owns
    them (its database and its figures), ``budget`` its budget (``budget.keys``: the limit)."""

    def __init__(self, ws: Any, budget: Budget) -> None:
        self.ws = ws
        self.budget = budget
        # key -> key info (type, key bytes, key group), oldest first: the backend's key cache
        self.resident: dict[Any, KeyInfo] = {}
        # resident keys whose record is in the database (deleted on eviction if they hold no
        # entry any more)
        self.present: set[Any] = set()
        # the default-namespace dict of each registered state, and its state id, in id order
        self.primary: list[dict[Any, Any]] = []
        self.primary_sids: list[int] = []
        self.sid_index: dict[int, int] = {}
        # resident key -> {state id: entry} of states restored but not registered yet
        self.extra: dict[Any, dict[int, Any]] = {}
        # resident keys set current again since admitted or spared (the key setter adds
        # them): spared once by the next eviction
        self.touched: set[Any] = set()
        # the keys the last prefetch made resident: their first records find them resident
        # and mark them touched, but that use is their admission, not a second one (the next
        # prefetch unmarks them, so that CLOCK spares only keys used again)
        self.fetched: list[Any] = []
        # the backend's key context: its current key is never evicted
        self.key_context: Any = None
        # keys set current that were resident so far (read through the key setter's counter)
        self.resident_hits: Callable[[], int] = lambda: 0

    def register(self, sid: int, ctx: Any) -> dict[Any, Any]:
        """The default-namespace dict of a state registering with id ``sid``. It must hold
        every resident key's entry, so the resident keys are written back and dropped first
        (states register before records flow); the current key of ``ctx`` stays resident."""
        self.release()
        d: dict[Any, Any] = {}
        self.sid_index[sid] = len(self.primary)
        self.primary.append(d)
        self.primary_sids.append(sid)
        if ctx.key_info[2] >= 0:  # registered while a key is current
            self.admit(ctx.key, ctx.key_info)
        return d

    def key_setter(self, ctx: Any, slow: KeySetter) -> KeySetter:
        """The backend's ``set_current_key``: a resident key is current at once (and marked
        touched for CLOCK); any other key goes to ``slow``, which admits it."""
        cache, touched = self.resident, self.touched
        hits = 0  # keys found resident (one closure-cell increment: no attribute, no call)

        def set_current_key(key: Any) -> None:
            nonlocal hits
            # get() rather than a KeyError: a miss is common here and raising costs ~0.3 us
            try:
                hit = cache.get(key)
            except TypeError:
                raise unhashable_key(key) from None
            if hit is None:
                return slow(key)
            if hit[0] is key.__class__:
                ctx.key = key
                ctx.key_info = hit
                touched.add(key)
                hits += 1
                return None
            return slow(key)  # a key equal to a resident key of another type (1 and True)

        self.resident_hits = lambda: hits
        return set_current_key

    def admit(self, key: Any, info: KeyInfo) -> None:
        """Make ``key`` resident: read its record (its default-namespace entries of every
        state, one database read) into the states' dicts; the oldest resident keys are written
        back and dropped first if over budget."""
        ws, res = self.ws, self.resident
        n = len(res)
        if n >= self.budget.keys:
            self.evict()
        elif n == PROBE_KEYS and not self.budget.fixed:  # measure early, before the budget is reached
            self.sample(list(itertools.islice(res, 64)), probe=True)
        ws.check_open()
        try:
            miss_path.admit(key, info, ws._db.get, codec.loads, self.present, self.sid_index, self.primary,
                            self.extra, res)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - RocksDB's errors (and an unreadable record) are plain exceptions
            raise ws.failed(e) from None
        ws.misses += 1

    def prefetch(self, keys: Iterable[Any], lo: int, hi: int) -> int:
        """Make the keys among ``keys`` that are not resident yet resident with one batched
        database read (RocksDB's multi-get: cheaper per key than a read per record). Keys
        that are unhashable or cannot be encoded, and keys of key groups outside ``lo..hi``,
        are skipped. Returns the number of keys read."""
        ws, res = self.ws, self.resident
        if self.fetched:
            self.touched.difference_update(self.fetched)
            self.fetched = []
        todo, infos, prefixes = miss_path.plan(keys, res, lo, hi, ws.max_parallelism, encode_key)
        if not todo:
            return 0
        ws.check_open()
        raws = ws.multi_get(prefixes)
        n = len(res)
        while n and n + len(todo) > self.budget.keys:
            self.evict()
            if len(res) == n:
                break
            n = len(res)
        probe = not self.budget.fixed and n < PROBE_KEYS <= n + len(todo)
        try:
            miss_path.install_many(todo, infos, raws, codec.loads, self.present, self.sid_index, self.primary,
                                   self.extra, res)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - an unreadable record
            raise ws.failed(e) from None
        if probe:  # measured once early, as admit() does
            self.sample(list(itertools.islice(res, 64)), probe=True)
        self.fetched = todo
        ws.misses += len(todo)
        ws.prefetched += len(todo)
        return len(todo)

    def write_back(self, keys: list[Any], batch: Any, drop: bool) -> None:
        """Write ``keys``' records into ``batch`` (see :func:`.miss_path.write_back_py`)."""
        miss_path.write_back(keys, self.resident, drop, self.primary, self.primary_sids, self.extra,
                             self.present, batch.put, batch.delete, codec.dumps, codec.PROTOCOL)  # fmt: skip

    def evict(self) -> None:
        """Write back and drop :data:`EVICT_FRACTION` of the resident keys, the oldest first,
        giving a second chance to keys set current again since they were admitted or last
        spared (they move to the back: CLOCK, an approximation of least recently used)."""
        ws, res = self.ws, self.resident
        ws.check_open()
        n = max(1, int(len(res) * EVICT_FRACTION))
        cur = self.key_context.key if self.key_context is not None else _MISSING
        victims = miss_path.clock_victims(res, n, self.touched, cur, _MISSING)
        if not self.budget.fixed:
            self.sample(victims[:16])
        batch = write_batch()
        self.write_back(victims, batch, True)
        ws.commit(batch)
        ws.evictions += 1

    def sample(self, keys: list[Any], probe: bool = False) -> None:
        """Refine the estimate of a resident key's bytes from ``keys`` (a moving average; a
        probe sets it) and split the budget again."""
        sample = []
        for key in keys:
            size = deep_size(key) + sys.getsizeof(self.resident[key][1]) + _RESIDENT_BYTES
            for t in self.primary:
                v = t.get(key, _MISSING)
                if v is not _MISSING:
                    size += deep_size(v) + _ENTRY_SLOT_BYTES
            sample.append(size)
        if sample:
            est = sum(sample) / len(sample)
            b = self.budget
            b.key_bytes = est if probe else 0.7 * b.key_bytes + 0.3 * est
            self.ws.rebudget()

    def release(self) -> None:
        """Write back every resident key's entries and drop them all."""
        res = self.resident
        if not res:
            return
        self.ws.check_open()
        batch = write_batch()
        self.write_back(list(res), batch, True)
        res.clear()
        self.touched.clear()
        self.fetched = []
        self.ws.commit(batch)

    def drop_key_groups(self, lo: int, hi: int) -> None:
        """Forget the resident keys of key groups ``lo..hi`` (their entries too)."""
        res = self.resident
        for key in [k for k, info in res.items() if lo <= info[2] <= hi]:
            del res[key]
            self.touched.discard(key)
            self.present.discard(key)
            self.extra.pop(key, None)
            for d in self.primary:
                d.pop(key, None)

    def clear(self) -> None:
        """Forget every resident key and entry (the working set closes)."""
        self.resident.clear()
        self.touched.clear()
        self.fetched = []
        self.present.clear()
        self.extra.clear()
        for d in self.primary:
            d.clear()


__all__ = ["PROBE_KEYS", "ResidentKeys"]
