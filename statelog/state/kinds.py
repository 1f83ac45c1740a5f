"""Keyed state with change capture.

Each state keeps one table per namespace: ``{namespace_bytes: {key: entry}}``, made by the
store of its backend (:mod:`statelog.state.tables`: dicts, or a disk-backed cache). Every
mutation updates the table and appends a change record to the state's changelog stream
(``state._append``; a no-op for a backend without changelog). A restore replays change
records with the state kind's applier (:mod:`statelog.restore.appliers`, shared with the
materializer), on the same tables. A state reaches the current key (and the clock) through
its backend's :class:`~statelog.state.context.KeyContext`, never through the backend.

With TTL, entries are stored as ``[value, expires_ms]`` (list elements and map values
individually); expired entries are invisible and are dropped lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from statelog import _ext
from statelog.changelog.ops import Op
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateInfo,
    TtlUpdate,
    ValueStateDescriptor,
)
from statelog.errors import StatelogError
from statelog.keys.encoding import check_map_key, decode_key, encode_key, is_legacy_key
from statelog.restore.appliers import applier_for
from statelog.state.context import KeyContext
from statelog.state.tables import MemoryStateTables, StateTables
from statelog.types import fast_check, make_validator

if TYPE_CHECKING:
    from statelog.changelog.stream import ChangelogStream

_MISSING = object()

# the ops written into records as plain ints (the segment encoder caches the constant
# columns of exact ints)
_PUT, _DELETE = Op.PUT.value, Op.DELETE.value
_LIST_APPEND, _LIST_REPLACE = Op.LIST_APPEND.value, Op.LIST_REPLACE.value
_MAP_PUT, _MAP_REMOVE = Op.MAP_PUT.value, Op.MAP_REMOVE.value

# The C version of the value-state update (statelog/_ext/fastpath.c), when it was built;
# STATELOG_PURE_PYTHON=1 forces the pure-Python closures (the reference implementation).
_FORCE_PYTHON = _ext.FORCE_PYTHON
try:
    from statelog._ext import fastpath as _fastpath
except ImportError:  # not built (e.g. no compiler): the closures below are used
    _fastpath = None


def _discard(_record: tuple) -> None:
    return None

NONE_NS = encode_key(None)


class KeyedState:
    """Common part: namespace handling, tables, iteration and replay."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        self._ctx = ctx
        self.descriptor = descriptor
        self.info = StateInfo.from_descriptor(descriptor)
        self.name = descriptor.name
        self._stream = stream
        self._narrow = stream is not None and stream.narrow
        self._append: Callable[[tuple], None] = stream.append if stream is not None else _discard
        self._buf: list[Any] = stream.buf if stream is not None else []
        self._buf_limit = stream.normal_limit if stream is not None else 1 << 62
        if stream is not None:
            stream.owner = self
        self._check = make_validator(descriptor.value_type, descriptor.name)
        self._ttl = descriptor.ttl.ttl_ms if descriptor.ttl is not None else 0
        self._applier = applier_for(self.info, expiring=bool(self._ttl))
        self._ttl_on_read = (
            descriptor.ttl is not None and descriptor.ttl.update is TtlUpdate.ON_READ_AND_WRITE
        )
        # the tables of this state in its backend's store (statelog.state.tables); in memory
        # for a context without one (any object with the key context's slots)
        ws = getattr(ctx, "working_set", None)
        mutable = bool(self._ttl) or isinstance(descriptor, ListStateDescriptor | MapStateDescriptor)
        self._store: StateTables = (
            ws.state_tables(self.name, mutable, ctx) if ws is not None else MemoryStateTables()
        )
        self._new_table: Callable[[bytes], Any] = self._store.new_table
        self._tables: dict[bytes, Any] = {NONE_NS: self._new_table(NONE_NS)}
        self._namespaces: dict[bytes, Any] = {NONE_NS: None}
        self._ns: Any = None
        self._nsb = NONE_NS
        self._cur: dict[Any, Any] = self._tables[NONE_NS]
        self._nsctx: list[Any] = [self._cur, self._nsb]  # the same, for the C fast path
        for nsb in self._store.restored_namespaces():
            self._table_for(nsb)

    # -- namespace -----------------------------------------------------------------------------

    def set_namespace(self, namespace: Any) -> None:
        """Scope further calls to ``namespace`` (e.g. a window); ``None`` is the default."""
        if namespace is self._ns:
            return
        if not self._cur and self._nsb != NONE_NS:  # drop emptied namespaces (old windows)
            del self._tables[self._nsb]
            del self._namespaces[self._nsb]
        nsb = encode_key(namespace)
        table = self._tables.get(nsb)
        if table is None:
            table = self._tables[nsb] = self._new_table(nsb)
            self._namespaces[nsb] = namespace
        self._ns, self._nsb, self._cur = namespace, nsb, table
        self._nsctx[0] = table
        self._nsctx[1] = nsb

    @property
    def namespace(self) -> Any:
        return self._ns

    # -- helpers -------------------------------------------------------------------------------

    def _now(self) -> int:
        return self._ctx.clock()

    def _emit(self, op: int, ukey: Any, value: Any, expires: int | None) -> None:
        ki = self._ctx.key_info
        if self._narrow:
            self._append((ki[1], ki[2], self._nsb, op, value))
        else:
            self._append((ki[1], ki[2], self._nsb, op, ukey, value, expires))
        if len(self._buf) >= self._buf_limit:
            self._stream.on_buffer_full()  # type: ignore[union-attr]

    def clear(self) -> None:
        """Remove the entry of the current key and namespace."""
        if self._cur.pop(self._ctx.key, _MISSING) is not _MISSING:
            self._emit(_DELETE, None, None, None)

    # -- iteration (snapshots, tools, tests) --------------------------------------------------

    def entries(self, now: int | None = None) -> Iterator[tuple[Any, Any, Any]]:
        """Yield ``(key, namespace, value)`` for every live entry (TTL-expired ones skipped)."""
        load_all = getattr(self._ctx, "load_all", None)  # any object with the key context's slots
        if load_all is not None:
            load_all()
        if now is None:
            now = self._now()
        for key, ns, entry in self._store.stored(self._tables, self._namespaces):
            v = self._visible(entry, now)
            if v is not _MISSING:
                yield key, ns, v

    def _visible(self, entry: Any, now: int) -> Any:
        if not self._ttl:
            return entry
        return entry[0] if entry[1] > now else _MISSING

    def prune(self) -> None:
        """Drop tables of namespaces that hold no entries (after replay)."""
        for nsb in [n for n, t in self._tables.items() if not t and n != NONE_NS and n != self._nsb]:
            del self._tables[nsb]
            del self._namespaces[nsb]

    def namespaces_of_current_key(self) -> list[Any]:
        key = self._ctx.key
        return [self._namespaces[nsb] for nsb, t in self._tables.items() if key in t]

    # -- replay --------------------------------------------------------------------------------

    def _table_for(self, nsb: bytes) -> dict[Any, Any]:
        table = self._tables.get(nsb)
        if table is None:
            ns = decode_key(nsb)
            if self._ctx.changelog_enabled and is_legacy_key(ns):
                raise self._ctx.legacy_key_error(self.name, nsb)
            table = self._tables[nsb] = self._new_table(nsb)
            self._namespaces[nsb] = ns
        return table

    def put_rows(self, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any]) -> None:
        """Bulk-load restored entries by key bytes (a disk store puts them straight into its
        database)."""
        self._store.put_rows(kbs, kgs, nss, entries, self._table_for)

    def apply_many(self, records: Iterable[tuple[bytes, bytes, int, Any, Any, int | None]], keys: dict[bytes, Any]) -> None:
        """Apply change records ``(key bytes, namespace bytes, op, user key, value, expires)``
        in order (restore path; what each op does: :mod:`statelog.restore.appliers`); ``keys``
        maps key bytes to decoded keys."""
        self._applier.apply_all(records, self._store.replay_table_for(self._table_for), keys)


class ValueState(KeyedState):
    """One value per key and namespace."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        self._default = descriptor.default if isinstance(descriptor, ValueStateDescriptor) else None
        if self._ttl:
            self.value = self._ttl_value  # type: ignore[method-assign]
            self.update = self._ttl_update  # type: ignore[method-assign]
        elif not ctx.changelog_enabled:
            self.update = self._heap_update  # type: ignore[method-assign]
        if not self._ttl:
            self._install_fast_paths()

    def _install_fast_paths(self) -> None:
        """Replace ``value``/``update`` by closures: the per-record hot path of most jobs."""
        state, ctx, default = self, self._ctx, self._default
        stream, buf = self._stream, self._buf
        check, clear = self._check, self.clear

        def value() -> Any:
            return state._cur.get(ctx.key, default)

        self.value = value  # type: ignore[method-assign]
        fast = fast_check(self.descriptor.value_type)
        if fast is None:
            return
        pytype, lo, hi = fast
        if lo is None:
            lo, hi = -1, 1  # only consulted for ints
        if _fastpath is not None and not _FORCE_PYTHON:
            self.update = _fastpath.make_update(  # type: ignore[method-assign]
                ctx, buf if stream is not None else None, stream, pytype, lo, hi,
                check, clear, _PUT, self._nsctx,
                stream.limit_cell if stream is not None else None,
            )
            return

        if stream is None:

            def update(v: Any) -> None:
                if v.__class__ is not pytype or (pytype is int and not lo <= v <= hi):
                    if v is None:
                        clear()
                        return
                    check(v)
                state._cur[ctx.key] = v

        else:
            extend, put, limit_cell = buf.extend, _PUT, stream.limit_cell

            def update(v: Any) -> None:
                if v.__class__ is not pytype or (pytype is int and not lo <= v <= hi):
                    if v is None:
                        clear()
                        return
                    check(v)
                state._cur[ctx.key] = v
                ki = ctx.key_info
                extend((ki[1], ki[2], state._nsb, put, v))
                # the limit drops to 0 while the writer applies back-pressure
                if len(buf) >= limit_cell[0]:
                    stream.on_buffer_full()

        self.update = update  # type: ignore[method-assign]

    def value(self) -> Any:
        return self._cur.get(self._ctx.key, self._default)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        self._cur[self._ctx.key] = value
        self._emit(_PUT, None, value, None)

    def _heap_update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        self._cur[self._ctx.key] = value

    def _ttl_value(self) -> Any:
        entry = self._cur.get(self._ctx.key)
        if entry is None:
            return self._default
        now = self._now()
        if entry[1] <= now:
            del self._cur[self._ctx.key]
            return self._default
        if self._ttl_on_read:
            entry[1] = now + self._ttl
            self._emit(_PUT, None, entry[0], entry[1])
        return entry[0]

    def _ttl_update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        exp = self._now() + self._ttl
        self._cur[self._ctx.key] = [value, exp]
        self._emit(_PUT, None, value, exp)


class ReducingState(ValueState):
    """A value folded with the descriptor's ``reduce_fn``."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        assert isinstance(descriptor, ReducingStateDescriptor)
        self._reduce = descriptor.reduce_fn

    def get(self) -> Any:
        return self.value()

    def add(self, value: Any) -> None:
        cur = self.value()
        self.update(value if cur is None else self._reduce(cur, value))  # type: ignore[misc]


class AggregatingState(ValueState):
    """An accumulator updated with the descriptor's aggregate function."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        assert isinstance(descriptor, AggregatingStateDescriptor)
        self._agg = descriptor.aggregate

    def get(self) -> Any:
        acc = self.value()
        return None if acc is None else self._agg.get_result(acc)  # type: ignore[union-attr]

    def accumulator(self) -> Any:
        return self.value()

    def add(self, value: Any) -> None:
        acc = self.value()
        if acc is None:
            acc = self._agg.create_accumulator()  # type: ignore[union-attr]
        self.update(self._agg.add(value, acc))  # type: ignore[union-attr]


class ListState(KeyedState):
    """A list per key and namespace. ``get`` returns a copy; mutate through the methods."""

    def get(self) -> list[Any]:
        entry = self._cur.get(self._ctx.key)
        if entry is None:
            return []
        if not self._ttl:
            return list(entry)
        now = self._now()
        live = [e for e in entry if e[1] > now]
        if len(live) != len(entry):
            if live:
                self._cur[self._ctx.key] = live
            else:
                del self._cur[self._ctx.key]
        if self._ttl_on_read and live:
            exp = now + self._ttl
            for e in live:
                e[1] = exp
            self._emit(_LIST_REPLACE, None, [e[0] for e in live], exp)
        return [e[0] for e in live]

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: list[Any]) -> None:
        values = list(values)
        if not values:
            return
        for v in values:
            if v is None:
                raise StatelogError(f"list state {self.name!r}: None elements are not allowed")
            self._check(v)
        key = self._ctx.key
        entry = self._cur.get(key)
        if entry is None:
            entry = self._cur[key] = []
        exp = None
        if self._ttl:
            exp = self._now() + self._ttl
            entry.extend([v, exp] for v in values)
        else:
            entry.extend(values)
        self._emit(_LIST_APPEND, None, values, exp)

    def update(self, values: list[Any]) -> None:
        """Replace the list (an empty list clears it)."""
        values = list(values)
        if not values:
            self.clear()
            return
        for v in values:
            if v is None:
                raise StatelogError(f"list state {self.name!r}: None elements are not allowed")
            self._check(v)
        exp = None
        if self._ttl:
            exp = self._now() + self._ttl
            self._cur[self._ctx.key] = [[v, exp] for v in values]
        else:
            self._cur[self._ctx.key] = values
        self._emit(_LIST_REPLACE, None, list(values), exp)

    def _visible(self, entry: Any, now: int) -> Any:
        if not self._ttl:
            return list(entry)
        live = [e[0] for e in entry if e[1] > now]
        return live if live else _MISSING


class MapState(KeyedState):
    """A map per key and namespace. Reads return copies; an empty map is no entry."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        assert isinstance(descriptor, MapStateDescriptor)
        self._check_ukey = make_validator(descriptor.key_type, f"{descriptor.name} (map key)")

    def _live(self) -> dict[Any, Any] | None:
        m = self._cur.get(self._ctx.key)
        if m is None or not self._ttl:
            return m
        now = self._now()
        dead = [k for k, e in m.items() if e[1] <= now]
        for k in dead:
            del m[k]
        if not m:
            del self._cur[self._ctx.key]
            return None
        return m

    def _read(self, m: dict[Any, Any], uk: Any) -> Any:
        e = m[uk]
        if not self._ttl:
            return e
        if self._ttl_on_read:
            e[1] = self._now() + self._ttl
            self._emit(_MAP_PUT, uk, e[0], e[1])
        return e[0]

    def get(self, user_key: Any, default: Any = None) -> Any:
        m = self._live()
        if m is None or user_key not in m:
            return default
        return self._read(m, user_key)

    def contains(self, user_key: Any) -> bool:
        m = self._live()
        return m is not None and user_key in m

    def put(self, user_key: Any, value: Any) -> None:
        if value is None:
            raise StatelogError(f"map state {self.name!r}: None values are not allowed; use remove()")
        self._check_ukey(user_key)
        check_map_key(user_key)
        self._check(value)
        key = self._ctx.key
        m = self._cur.get(key)
        if m is None:
            m = self._cur[key] = {}
        exp = None
        if self._ttl:
            exp = self._now() + self._ttl
            m[user_key] = [value, exp]
        else:
            m[user_key] = value
        self._emit(_MAP_PUT, user_key, value, exp)

    def put_all(self, mapping: dict[Any, Any]) -> None:
        for k, v in mapping.items():
            self.put(k, v)

    def remove(self, user_key: Any) -> None:
        key = self._ctx.key
        m = self._cur.get(key)
        if m is None or user_key not in m:
            return
        del m[user_key]
        if not m:
            del self._cur[key]
        self._emit(_MAP_REMOVE, user_key, None, None)

    def items(self) -> list[tuple[Any, Any]]:
        m = self._live()
        if m is None:
            return []
        if not self._ttl:
            return list(m.items())
        return [(k, self._read(m, k)) for k in list(m)]

    def keys(self) -> list[Any]:
        m = self._live()
        return [] if m is None else list(m)

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return self._live() is None

    def _visible(self, entry: Any, now: int) -> Any:
        if not self._ttl:
            return dict(entry)
        live = {k: e[0] for k, e in entry.items() if e[1] > now}
        return live if live else _MISSING


STATE_CLASSES: dict[type, type[KeyedState]] = {
    ValueStateDescriptor: ValueState,
    ListStateDescriptor: ListState,
    MapStateDescriptor: MapState,
    ReducingStateDescriptor: ReducingState,
    AggregatingStateDescriptor: AggregatingState,
}
