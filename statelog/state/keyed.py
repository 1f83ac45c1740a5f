"""The common part of every keyed state kind: :class:`KeyedState`.

Each state keeps one table per namespace: ``{namespace_bytes: {key: entry}}``, made by the
store of its backend (:mod:`statelog.state.tables`: dicts, or a disk-backed cache). Every
mutation updates the table and appends a change record to the state's changelog stream
(``state._append``; a no-op for a backend without changelog). A restore replays change
records with the state kind's applier (:mod:`statelog.restore.appliers`, shared with the
materializer), on the same tables. A state reaches the current key (and the clock) through
its backend's :class:`~statelog.state.context.KeyContext`, never through the backend.

With TTL, entries are stored as ``[value, expires_ms]`` (list elements and map values
individually); expired entries are invisible and are dropped lazily. The kinds:
:mod:`statelog.state.kinds` (value, reducing, aggregating) and
:mod:`statelog.state.containers` (list, map).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from statelog.changelog.ops import Op
from statelog.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    StateInfo,
    TtlUpdate,
)
from statelog.keys.encoding import decode_key, encode_key, is_legacy_key
from statelog.restore.appliers import applier_for
from statelog.state.context import KeyContext
from statelog.state.tables import MemoryStateTables, StateTables
from statelog.types import make_validator

if TYPE_CHECKING:
    from statelog.changelog.stream import ChangelogStream

# an entry that is absent (or expired)
_MISSING = object()

# the op written into records as a plain int (the segment encoder caches the constant
# columns of exact ints)
_DELETE = Op.DELETE.value

def _discard(_record: tuple) -> None:
    return None


# the namespace bytes of the default namespace (None)
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

    def replay_puts(self, nsb: bytes, keys: list[Any], values: list[Any], expires: list[int | None]) -> None:
        """Apply ``put`` change records of a value-like state to decoded ``keys`` of one
        namespace, in order (the last put of a key wins), in one bulk update (restore path)."""
        if self._applier.kind != "value-like":
            raise TypeError(f"state {self.name!r} is a {self._applier.kind} state: replay_puts is for value-like states")
        entries = map(list, zip(values, expires, strict=True)) if self._applier.expiring else values
        self._store.replay_table_for(self._table_for)(nsb).update(zip(keys, entries, strict=True))
