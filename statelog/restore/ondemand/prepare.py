"""A key group's restored state as the task thread installs it (:class:`PreparedKeyGroup`),
built from the decoded rows of table files and the change records of the tail."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import integer_numpy
from statelog.compute import pc
from statelog.descriptors import StateInfo
from statelog.restore.changes import base_entries
from statelog.restore.ondemand.tail import Records, TailReader

__all__ = ["EntryBuilder", "PreparedKeyGroup"]


@dataclass
class PreparedKeyGroup:
    """One key group's restored state, decoded, ready to be installed into the tables."""

    key_group: int
    # per state: (keys, namespaces, entries) of each materialized table part (base_entries;
    # key bytes instead of keys for a disk-backed working set)
    base: dict[str, list[tuple[list[Any], list[bytes], list[Any]]]] = field(default_factory=dict)
    # per state: change records (key bytes, namespace bytes, op, user key, value, expires), in order
    records: Records = field(default_factory=dict)
    rows: int = 0


def _split(table: pa.Table, kgs: list[int]) -> list[tuple[pa.Table, list[tuple[int, int]]]]:
    """``table`` (the rows of ``kgs``) as ``(rows, [(key group, rows)])`` parts in table order:
    one part when the rows are sorted by key group, as state tables are (docs/format.md 8)."""
    col = integer_numpy(table.column("key_group"))
    if len(col) == 0:
        return []
    if bool((np.diff(col) >= 0).all()):
        groups, counts = np.unique(col, return_counts=True)
        return [(table, [(int(g), int(n)) for g, n in zip(groups, counts, strict=True)])]
    out = []  # not sorted (never written so): one filter per key group
    for kg in kgs:
        part = table.filter(pc.equal(table.column("key_group"), kg))
        out.append((part, [(kg, part.num_rows)]))
    return out


class EntryBuilder:
    """Turns decoded table rows and tail records into :class:`PreparedKeyGroup` parts (either
    thread), checking the keys (``check_keys``) and counting rows and records."""

    def __init__(self, tail: TailReader, raw_keys: bool, first_key_group: int) -> None:
        self._tail = tail
        # a disk-backed working set takes key bytes, not decoded keys
        self._raw_keys = raw_keys
        self._first = first_key_group
        # (state, key array) -> raises on keys the backend cannot restore (KeyGroupLoader.start)
        self.check_keys: Callable[[str, Any], None] = lambda _state, _keys: None
        self.rows = 0
        self.records = 0
        self._lock = threading.Lock()

    def entries(
        self, kgs: list[int], decoded: list[tuple[StateInfo, pa.Table]], tails: dict[int, Records] | None = None
    ) -> list[PreparedKeyGroup]:
        """Keys, namespaces and entries of the decoded rows of ``kgs``, per key group, with their
        share of the tail (``tails``: given)."""
        out = {kg: PreparedKeyGroup(kg) for kg in kgs}
        for info, rows in decoded:
            for table, counts in _split(rows, kgs):
                if not table.num_rows:
                    continue
                self.check_keys(info.name, table.column("key"))
                keys, nss, values = base_entries(info, table, self._raw_keys)
                start = 0
                for kg, n in counts:
                    if n:
                        end = start + n
                        out[kg].base.setdefault(info.name, []).append((keys[start:end], nss[start:end], values[start:end]))
                        out[kg].rows += n
                        start = end
        if tails is None:
            tails = self._tail.of(kgs)
        for kg, p in out.items():
            p.records = tails.get(kg, {})
            self.count(p.rows, sum(len(r) for r in p.records.values()))
        return [out[kg] for kg in kgs]

    def whole_run(self, kgs: list[int], decoded: list[tuple[StateInfo, pa.Table]]) -> PreparedKeyGroup:
        """A piece of a run as one part, without its tail (for a working set in memory, which
        does not need the key groups apart): keys and entries of each decoded table."""
        p = PreparedKeyGroup(kgs[0])
        for info, rows in decoded:
            if rows.num_rows:
                self.check_keys(info.name, rows.column("key"))
                p.base.setdefault(info.name, []).append(base_entries(info, rows))
                p.rows += rows.num_rows
        self.count(p.rows, 0)
        return p

    def tail_part(self, kgs: list[int]) -> PreparedKeyGroup:
        """The tail records of ``kgs`` as one part, in key-group order (a key's records stay in
        their order: a key is in one key group), to install after their base entries."""
        p = PreparedKeyGroup(kgs[0] if kgs else self._first)
        for tail in self._tail.of(kgs).values():
            for name, records in tail.items():
                p.records.setdefault(name, []).extend(records)
        self.count(0, sum(len(r) for r in p.records.values()))
        return p

    def count(self, rows: int, records: int) -> None:
        with self._lock:  # (both threads prepare key groups)
            self.rows += rows
            self.records += records
