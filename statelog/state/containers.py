"""The container state kinds: a list (:class:`ListState`) and a map (:class:`MapState`)
per key and namespace.

Their entries are mutable Python lists and dicts in the tables (with TTL, elements and map
values are ``[value, expires_ms]`` each); reads return copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from statelog.changelog.ops import Op
from statelog.descriptors import MapStateDescriptor, StateDescriptor
from statelog.errors import StatelogError
from statelog.keys.encoding import check_map_key
from statelog.state import batch
from statelog.state.context import KeyContext
from statelog.state.keyed import _MISSING, KeyedState
from statelog.types import make_validator

if TYPE_CHECKING:
    from statelog.changelog.stream import ChangelogStream

# the ops written into records as plain ints (the segment encoder caches the constant
# columns of exact ints)
_LIST_APPEND, _LIST_REPLACE = Op.LIST_APPEND.value, Op.LIST_REPLACE.value
_MAP_PUT, _MAP_REMOVE = Op.MAP_PUT.value, Op.MAP_REMOVE.value

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

    def add_many(self, keys: Any, values: Any) -> None:
        """``add(value)`` of each key, in order: the elements of each key appended in one
        record (:mod:`statelog.state.batch`)."""
        batch.list_add_many(self, keys, values)

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


__all__ = ["ListState", "MapState"]
