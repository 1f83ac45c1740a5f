"""What each change operation does to state: one applier per state kind.

After Flink's ``*StateChangeApplier``: the meaning of every :class:`~statelog.changelog.ops.Op`
for a state kind is written here once, and both readers of the changelog use it: the
backend's restore (:meth:`statelog.state.keyed.KeyedState.apply_many`,
:meth:`statelog.state.timers.TimerService.apply`) and the materializer (list and map
states; its Arrow merge of value-like states and timers is an optimisation tested against
these appliers, ``tests/statelog/materialization/test_table_merge.py``).

An applier changes one table of entries ``{entry key: entry}`` of one state; the caller
picks the table and the entry key (a backend: the namespace's table and the decoded key;
the materializer: one image keyed by ``(key group, key bytes, namespace bytes)``). Entries:

============ ============================ ==================================
kind         ``expiring=False``           ``expiring=True`` (TTL)
============ ============================ ==================================
value-like   the value                    ``[value, expires_ms]``
list         ``[element, ...]``           ``[[element, expires_ms], ...]``
map          ``{user_key: value}``        ``{user_key: [value, expires_ms]}``
============ ============================ ==================================

An empty list or map is no entry. Timers are a set of timer tuples (the timestamp is part
of the tuple): ``timer_add`` adds one, ``timer_remove`` discards it. An op that is not valid
for the kind is a :class:`~statelog.errors.CorruptionError` (docs/format.md 4.5).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from statelog import _ext
from statelog._ext import IntTable, inttable, plain_table
from statelog.changelog.format import TIMER_STATES
from statelog.changelog.ops import Op, op_label
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import CorruptionError

# A change record as a restore groups them: (key bytes, namespace bytes, op, user key,
# value, expires_ms)
Record = tuple[bytes, bytes, int, Any, Any, "int | None"]

# records per bulk call of a restore: a call into C (zip, dict.update, numpy) holds the GIL
# until it returns, so one over a whole tail of 10^7 records held it for 10-15 s and starved
# the writer lease's renewal thread past its ttl (the process lost its root). Calls over at
# most this many records take milliseconds; threads switch between them.
BULK_RECORDS = 1 << 16

# table[key] = value for lists of keys and values in C with the dict's lines prefetched
# (statelog/_ext/fastpath.c put_items), when built and STATELOG_PURE_PYTHON is not set
_put_items = getattr(_ext.load("fastpath"), "put_items", None)


def as_list(xs: Any) -> list[Any]:
    """``xs`` as a list (a numpy array's items as Python ints and floats)."""
    return xs.tolist() if isinstance(xs, np.ndarray) else xs


def put_items(table: Any, keys: Any, values: Any) -> None:
    """``table.update(zip(keys, values))`` a ``BULK_RECORDS`` at a time (other threads run
    between): for a dict in C, each key's slot in the dict prefetched a few keys ahead (a
    restore's keys come in key-group order, random in the dict's index), and for an
    ``IntTable`` in int mode each key's slot the same way. ``keys`` may be an int64 numpy
    array (an ``IntTable`` takes them without key objects) and ``values`` one of int64s."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    n = len(keys)
    table = plain_table(table)
    if isinstance(keys, np.ndarray):
        done = 0
        if type(table) is IntTable:
            keys = np.ascontiguousarray(keys, np.int64)
            if isinstance(values, np.ndarray):
                values = np.ascontiguousarray(values, np.int64)
            while done < n and inttable.put_arrays(table, keys, values, done, min(n, done + BULK_RECORDS)):
                done = min(n, done + BULK_RECORDS)
        if done == n:
            return
        keys, values = keys[done:].tolist(), as_list(values[done:])  # (a table in dict mode, or a dict)
        n = len(keys)
    values = as_list(values)
    if type(table) is IntTable:
        for i in range(0, n, BULK_RECORDS):
            if inttable.put_items(table, keys, values, i, min(n, i + BULK_RECORDS)) is None:
                # a key that is not an int64: the table turns into a dict at the first one
                table.update(zip(keys[i : i + BULK_RECORDS], values[i : i + BULK_RECORDS], strict=True))
    elif _put_items is not None and type(table) is dict:
        for i in range(0, n, BULK_RECORDS):
            _put_items(table, keys, values, i, min(n, i + BULK_RECORDS))
    else:
        for i in range(0, n, BULK_RECORDS):
            table.update(zip(keys[i : i + BULK_RECORDS], values[i : i + BULK_RECORDS], strict=True))

# plain ints: an op read back from Arrow is an int, and int == int is the fastest compare
_PUT, _DELETE = Op.PUT.value, Op.DELETE.value
_LIST_APPEND, _LIST_REPLACE = Op.LIST_APPEND.value, Op.LIST_REPLACE.value
_MAP_PUT, _MAP_REMOVE = Op.MAP_PUT.value, Op.MAP_REMOVE.value
_TIMER_ADD, _TIMER_REMOVE = Op.TIMER_ADD.value, Op.TIMER_REMOVE.value


class StateChangeApplier:
    """Applies change records of one state to tables of its entries."""

    kind: ClassVar[str]
    ops: ClassVar[frozenset[Op]]

    def __init__(self, state: str, expiring: bool = False) -> None:
        self.state = state
        self.expiring = expiring

    def apply(self, entries: Any, key: Hashable, op: int, ukey: Any, value: Any, expires: int | None) -> None:
        """Apply one change record to the entry ``key`` of ``entries``."""
        raise NotImplementedError

    def apply_all(
        self, records: Iterable[Record], entries_for: Callable[[bytes], Any], keys: Mapping[bytes, Hashable]
    ) -> None:
        """Apply ``records`` in order: ``entries_for(namespace bytes)`` is the table of a
        namespace, ``keys`` maps key bytes to entry keys (a restore's decoded keys)."""
        apply = self.apply
        last: bytes | None = None
        table: Any = None
        for kb, nsb, op, ukey, value, exp in records:
            if nsb != last:
                table, last = entries_for(nsb), nsb
            apply(table, keys[kb], op, ukey, value, exp)

    def invalid(self, op: int) -> CorruptionError:
        return CorruptionError(
            f"state {self.state!r}: operation {op_label(op)} (code {op}) is not valid for {self.kind} state "
            f"(valid: {', '.join(o.label for o in sorted(self.ops))}); the changelog is corrupt or was "
            "written by another statelog version: restore an earlier checkpoint, or read it with the "
            "statelog version that wrote it"
        )


class ValueApplier(StateChangeApplier):
    """Value, reducing and aggregating state: ``put`` sets the entry, ``delete`` removes it."""

    kind = "value-like"
    ops = frozenset({Op.PUT, Op.DELETE})

    def apply(self, entries: Any, key: Hashable, op: int, ukey: Any, value: Any, expires: int | None) -> None:
        if op == _PUT:
            entries[key] = [value, expires] if self.expiring else value
        elif op == _DELETE:
            entries.pop(key, None)
        else:
            raise self.invalid(op)

    def apply_all(
        self, records: Iterable[Record], entries_for: Callable[[bytes], Any], keys: Mapping[bytes, Hashable]
    ) -> None:
        # :meth:`apply` inlined (a restore's hot loop: one call less per record); the same
        # rule, checked against apply() in tests/statelog/restore/test_appliers.py
        expiring = self.expiring
        if not isinstance(records, list):
            records = list(records)
        if len(records) > BULK_RECORDS:  # in order, a bounded call at a time (BULK_RECORDS)
            for i in range(0, len(records), BULK_RECORDS):
                self.apply_all(records[i : i + BULK_RECORDS], entries_for, keys)
            return
        if len(records) > 1:
            # the common tail: only puts, to one namespace; one bulk update in order (the last
            # put of a key wins, as it does one record at a time)
            kbs, nss, ops, _ukeys, values, exps = zip(*records, strict=True)
            n = len(records)
            if ops.count(_PUT) == n and nss.count(nss[0]) == n:
                entries = list(map(list, zip(values, exps, strict=True))) if expiring else list(values)
                put_items(entries_for(nss[0]), list(map(keys.__getitem__, kbs)), entries)
                return
        last: bytes | None = None
        table: Any = None
        for kb, nsb, op, _ukey, value, exp in records:
            if nsb != last:
                table, last = entries_for(nsb), nsb
            if op == _PUT:
                table[keys[kb]] = [value, exp] if expiring else value
            elif op == _DELETE:
                table.pop(keys[kb], None)
            else:
                raise self.invalid(op)


class ListApplier(StateChangeApplier):
    """List state: append elements, replace the list, or delete it."""

    kind = "list"
    ops = frozenset({Op.LIST_APPEND, Op.LIST_REPLACE, Op.DELETE})

    def apply(self, entries: Any, key: Hashable, op: int, ukey: Any, value: Any, expires: int | None) -> None:
        if op == _LIST_APPEND:
            entry = entries.get(key)
            if entry is None:
                entry = entries[key] = []
            entry.extend([[v, expires] for v in value] if self.expiring else value)
        elif op == _LIST_REPLACE:
            entries[key] = [[v, expires] for v in value] if self.expiring else list(value)
        elif op == _DELETE:
            entries.pop(key, None)
        else:
            raise self.invalid(op)


class MapApplier(StateChangeApplier):
    """Map state: put or remove one map key (an emptied map is removed), or delete the map."""

    kind = "map"
    ops = frozenset({Op.MAP_PUT, Op.MAP_REMOVE, Op.DELETE})

    def apply(self, entries: Any, key: Hashable, op: int, ukey: Any, value: Any, expires: int | None) -> None:
        if op == _MAP_PUT:
            m = entries.get(key)
            if m is None:
                m = entries[key] = {}
            m[ukey] = [value, expires] if self.expiring else value
        elif op == _MAP_REMOVE:
            m = entries.get(key)
            if m is not None:
                m.pop(ukey, None)
                if not m:
                    del entries[key]
        elif op == _DELETE:
            entries.pop(key, None)
        else:
            raise self.invalid(op)


class TimerApplier(StateChangeApplier):
    """Timer pseudo-states: ``entries`` is a set of timers and ``key`` the timer (a tuple
    holding its timestamp, key and namespace); the record's value is the timestamp."""

    kind = "timer"
    ops = frozenset({Op.TIMER_ADD, Op.TIMER_REMOVE})

    def apply(self, entries: Any, key: Hashable, op: int, ukey: Any, value: Any, expires: int | None) -> None:
        if op == _TIMER_ADD:
            entries.add(key)
        elif op == _TIMER_REMOVE:
            entries.discard(key)
        else:
            raise self.invalid(op)


def applier_for(info: StateInfo, expiring: bool | None = None) -> StateChangeApplier:
    """The applier of a state; ``expiring`` defaults to whether the state has a TTL."""
    exp = info.ttl is not None if expiring is None else expiring
    if info.name in TIMER_STATES:
        return TimerApplier(info.name)
    if info.kind is StateKind.LIST:
        return ListApplier(info.name, exp)
    if info.kind is StateKind.MAP:
        return MapApplier(info.name, exp)
    return ValueApplier(info.name, exp)
