"""Installing restored state into the states of one keyed backend: :class:`StateInstaller`.

What a restore read (:class:`~statelog.restore.changes.RestoredChanges`, at once) or prepared
per key group (:class:`~statelog.restore.ondemand.prepare.PreparedKeyGroup`, on demand)
becomes entries of the states' tables: the materialized base is bulk-loaded (by key bytes
straight into the database of a disk-backed working set), then the changelog tail is applied
with the state kind's applier. What arrives for a state that has not registered yet waits
until it registers. During an on-demand restore it also drives the task thread's side of the
:class:`~statelog.restore.ondemand.loader.KeyGroupLoader` and times it (the backend's
``restore_stats``). Only the task thread calls it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statelog.arrays import binary_array
from statelog.descriptors import StateDescriptor
from statelog.errors import ConfigError
from statelog.keys.columns import decode_key_array, first_legacy_key
from statelog.keys.encoding import encode_key
from statelog.restore.appliers import BULK_RECORDS, as_list, put_items
from statelog.restore.changes import RestoredChanges, base_entries
from statelog.restore.collector import gc_paused
from statelog.restore.ondemand.loader import KeyGroupLoader
from statelog.restore.ondemand.prepare import PreparedKeyGroup

if TYPE_CHECKING:
    from statelog.state.context import KeyContext
    from statelog.state.keyed import KeyedState
    from statelog.state.tables.disk import DiskWorkingSet

log = logging.getLogger(__name__)

NONE_NS = encode_key(None)  # the default namespace

__all__ = ["StateInstaller"]

# (key bytes, namespace bytes, op, user key, value, expires)
Record = tuple[bytes, bytes, int, Any, Any, int | None]
# (keys or key bytes, namespace bytes, entries) of one table part
Entries = tuple[list[Any], list[bytes], list[Any]]


class StateInstaller:
    """Turns restored tables and change records into the entries of one backend's states.

    ``states`` is the backend's registry of states (name -> state), read as states register;
    ``disk`` the backend's disk-backed working set (``None`` in memory); ``subtask`` names
    the backend in the log."""

    def __init__(
        self,
        ctx: KeyContext,
        subtask: int,
        states: dict[str, KeyedState],
        restored: RestoredChanges,
        disk: DiskWorkingSet | None,
    ) -> None:
        self._ctx = ctx
        self._subtask = subtask
        self._states = states
        self.restored = restored
        self._disk = disk
        self._stash: dict[str, list[tuple[list[Entries], list[Record]]]] = {}  # loaded, state not registered
        self._decoded_keys: dict[bytes, Any] = {}
        self.stats: dict[str, Any] = {"on_demand": False}  # (the backend's restore_stats)
        self._expected: dict[str, int] = {}  # state -> rows a bulk load of all key groups brings
        self._opened = 0.0

    def check_compatible(self, descriptor: StateDescriptor) -> None:
        """Refuse a descriptor the restored state of its name cannot be read as."""
        stored = self.restored.infos.get(descriptor.name)
        if stored is not None:
            why = descriptor.compatible_with(stored)
            if why is not None:
                raise ConfigError(
                    f"state {descriptor.name!r} of operator {self._ctx.operator_uid!r} cannot be restored: "
                    f"{why}; keep the stored type or use a new state name"
                )

    def check_keys(self, state: str, arr: Any) -> None:
        """Refuse version-1 keys a writing backend restores (a read-only one reads them)."""
        if self._ctx.changelog_enabled and not pa.types.is_integer(arr.type):  # (int: a table image's keys)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            kb = first_legacy_key(arr)
            if kb is not None:
                raise self._ctx.legacy_key_error(state, kb)

    def replay(self, state: KeyedState) -> None:
        """Build a state that just registered from everything restored for it: its
        materialized rows, the key groups loaded on demand before, and its changelog tail."""
        with gc_paused():
            self._load_base(state)
            for bases, records in self._stash.pop(state.name, ()):
                for entries in bases:
                    self._put_entries(state, *entries)
                if records:
                    self._apply_records(state, records)
            records = self.restored.records.pop(state.name, None)
            if records:
                self._apply_records(state, records)
            state.prune()

    # -- on-demand restore (statelog/restore/ondemand/) ----------------------------------------

    def start(self, loader: KeyGroupLoader) -> None:
        """Begin an on-demand restore (the cyclic GC is paused until the loader is closed)."""
        self.stats["on_demand"] = True
        self._opened = time.monotonic()
        loader.start(self.check_keys)

    def load(self, loader: KeyGroupLoader, kg: int | None, kb: bytes | None = None) -> bool:
        """Install what the loader prepared, and key group ``kg`` (preparing it if needed), or
        only the slice of it that holds key bytes ``kb``. Returns whether every key group is
        loaded now (the loader is closed then)."""
        if loader.load(self.install, kg, kb):
            self.stats.setdefault("first_key_group_s", round(time.monotonic() - self._opened, 6))
        if not loader.done:
            return False
        self._loaded(loader)
        return True

    def load_all(self, loader: KeyGroupLoader) -> None:
        """Load every key group not loaded yet, on this thread, and close the loader."""
        self._expected = _expected_rows(loader)
        for p in loader.take_all():
            self.install(p)
            # dropped before the collector resumes (in _loaded): the last part is the whole
            # tail, whose record tuples its first collection would otherwise traverse
            # (seconds at 10^7 records, with the GIL held)
            del p
        self._loaded(loader)

    def _loaded(self, loader: KeyGroupLoader) -> None:
        loader.close()
        for state in self._states.values():
            state.prune()
        self.stats.update(
            fully_loaded_s=round(time.monotonic() - self._opened, 6), rows=loader.rows,
            records=loader.records, bytes_read=loader.bytes_read,
        )  # fmt: skip
        log.info(
            "operator %r subtask %d: every key group loaded on demand in %.3fs (%d rows, %d records, %d bytes)",
            self._ctx.operator_uid, self._subtask, self.stats["fully_loaded_s"], loader.rows, loader.records,
            loader.bytes_read,
        )  # fmt: skip

    def install(self, p: PreparedKeyGroup) -> None:
        """Install one key group an on-demand restore prepared."""
        disk = self._disk
        with gc_paused():
            if disk is not None:  # key bytes of every state: straight into the database, at once
                bases = {name: parts for name, parts in p.base.items() if parts}
                if bases:
                    disk.put_key_group(p.key_group, bases)
                    for name, parts in bases.items():
                        state = self._states.get(name)
                        if state is not None:  # (one that registers later finds them in the database)
                            for nsb in {nsb for _kbs, nss, _v in parts for nsb in set(nss)}:
                                state._table_for(nsb)
            for name in p.base.keys() | p.records.keys():
                bases = p.base.get(name, []) if disk is None else []
                records = p.records.get(name, [])
                if not bases and not records:
                    continue
                state = self._states.get(name)
                if state is None:  # installed when the state registers
                    self._stash.setdefault(name, []).append((bases, records))
                    continue
                for entries in bases:
                    self._put_entries(state, *entries)
                if records:
                    self._apply_records(state, records)

    def _load_base(self, state: KeyedState) -> None:
        """Bulk-load the materialized rows of ``state`` (before its changelog tail is replayed)."""
        tables = self.restored.base.pop(state.name, ())
        if self._disk is None and len(tables) > 1:
            self._expected[state.name] = sum(t.num_rows for t in tables)
        for table in tables:
            self.check_keys(state.name, table.column("key"))
            if self._disk is not None:
                kbs, nss, values = base_entries(state.info, table, raw_keys=True)
                state.put_rows(kbs, table.column("key_group").to_pylist(), nss, values)
            else:
                self._put_entries(state, *base_entries(state.info, table))

    def _put_entries(self, state: KeyedState, keys: Any, nss: list[bytes], values: Any) -> None:
        if nss and nss.count(nss[0]) == len(nss):  # one namespace: bulk updates of BULK_RECORDS
            table = state._table_for(nss[0])
            expected = self._expected.pop(state.name, 0) if nss[0] == NONE_NS else 0
            if expected > len(keys) and hasattr(table, "reserve"):
                # (an IntTable: room for the rows to come, no resizes; some may be in already,
                # from key groups loaded on first use)
                table.reserve(expected)
            put_items(table, keys, values)
        else:
            table_for = state._table_for
            keys, values = as_list(keys), as_list(values)  # (numpy arrays of int64s: ints)
            for key, nsb, v in zip(keys, nss, values, strict=True):
                table_for(nsb)[key] = v

    def _apply_records(self, state: KeyedState, records: list[Record]) -> None:
        known = self._decoded_keys
        new = list({r[0] for r in records if r[0] not in known})
        # decode the keys in bulk (int and short-string columns decode without a loop), a bounded
        # call at a time (BULK_RECORDS: other threads, the lease's renewal, run between them)
        for i in range(0, len(new), BULK_RECORDS):
            part = new[i : i + BULK_RECORDS]
            arr = binary_array(part)
            self.check_keys(state.name, arr)
            known.update(zip(part, decode_key_array(arr), strict=True))
        state.apply_many(records, known)
        if self._disk is not None and len(known) > 1 << 16:
            known.clear()  # bounded with a disk-backed working set


def _expected_rows(loader: KeyGroupLoader) -> dict[str, int]:
    """The materialized rows of each state within the loader's key groups (a file's rows in
    proportion to the key groups it shares with them)."""
    rows: dict[str, int] = {}
    seen: set[str] = set()
    for parts in loader.files.of.values():
        for (info, f, mine), _entry in parts:
            if f.path not in seen:
                seen.add(f.path)
                rows[info.name] = rows.get(info.name, 0) + f.rows * len(mine) // max(1, len(f.key_groups))
    return rows
