"""The in-memory store: every state's entries in memory (``state_store="memory"``).

A table is ``{key: entry}`` per state and namespace: an ``IntTable``
(``statelog/_ext/inttable.c``), which keeps int64 keys in one flat array and behaves as a
dict for every key (it turns into one at the first key of another kind), or a ``dict`` when
the C extension is not built. The key cache maps each key seen to its encoding and key
group, and is cleared when it reaches :data:`KEY_CACHE_LIMIT` keys (it only saves encoding
a key again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

from statelog._ext import IntTable
from statelog.keys.encoding import decode_key
from statelog.state.tables.base import (
    KeyInfo,
    KeySetter,
    StateTables,
    Table,
    WorkingSet,
    unhashable_key,
)

KEY_CACHE_LIMIT = 1 << 20


class MemoryStateTables(StateTables):
    """A state's tables in memory: ``IntTable`` or ``dict``."""

    def new_table(self, nsb: bytes) -> Any:
        return IntTable() if IntTable is not None else {}

    def stored(self, tables: Mapping[bytes, Table], namespaces: Mapping[bytes, Any]) -> Iterator[tuple[Any, Any, Any]]:
        for nsb, table in tables.items():
            ns = namespaces[nsb]
            for key, entry in table.items():  # type: ignore[attr-defined]
                yield key, ns, entry

    def replay_table_for(self, table_for: Callable[[bytes], Table]) -> Callable[[bytes], Table]:
        return table_for  # every key's entries are in the dicts

    def put_rows(
        self, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any], table_for: Callable[[bytes], Table],
    ) -> None:
        for kb, nsb, entry in zip(kbs, nss, entries, strict=True):
            table_for(nsb)[decode_key(kb)] = entry


class MemoryWorkingSet(WorkingSet):
    """The store of a backend whose states keep their entries in dicts."""

    on_disk: ClassVar[bool] = False

    def __init__(self, key_cache_limit: int = KEY_CACHE_LIMIT) -> None:
        self.key_cache: dict[Any, KeyInfo] = {}
        self.key_cache_limit = key_cache_limit

    def __repr__(self) -> str:
        return f"MemoryWorkingSet({len(self.key_cache)} cached keys)"

    def attach(self, ctx: Any) -> None:
        ctx.working_set = self

    def state_tables(self, name: str, mutable: bool, ctx: Any) -> MemoryStateTables:
        return MemoryStateTables()

    def key_setter(self, ctx: Any, slow: KeySetter) -> KeySetter:
        cache = self.key_cache

        def set_current_key(key: Any) -> None:
            try:
                hit = cache[key]
            except KeyError:  # rare: the cache holds every key seen since it was last cleared
                return slow(key)
            except TypeError:
                raise unhashable_key(key) from None
            if hit[0] is key.__class__:
                ctx.key = key
                ctx.key_info = hit
                return None
            return slow(key)  # a key equal to a cached key of another type (1 and True)

        return set_current_key

    def admit(self, key: Any, info: KeyInfo) -> None:
        cache = self.key_cache
        if len(cache) >= self.key_cache_limit:
            cache.clear()
        cache[key] = info

    def prefetch(self, keys: Iterable[Any], lo: int, hi: int) -> int:
        return 0  # every entry is in memory: nothing to read

    def close(self) -> None:
        return None  # nothing outside the process's objects


__all__ = ["KEY_CACHE_LIMIT", "MemoryStateTables", "MemoryWorkingSet"]
