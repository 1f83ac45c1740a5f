"""The working set: what a keyed backend and its states need from the store of their entries.

Two stores implement it, file for file: :mod:`statelog.state.tables.memory` keeps the
entries in Python dicts, :mod:`statelog.state.tables.disk` in a local RocksDB database under
a bounded cache. The states' API, their change records, checkpoints and formats are the
same for both; only where the entries live differs.

* :class:`WorkingSet` is the store of one backend: its key cache (the keys whose encoding
  is known, and with the disk store, whose entries are in the states' dicts), the
  per-record key setter over it, the tables of each state, and prefetching.
* :class:`StateTables` is the part of it one state sees: a table per namespace, the
  entries stored for a whole-state read, the tables a restore writes to, bulk loads.
* :class:`Table` is one table (one state, one namespace): ``{key: entry}`` with the part
  of the ``dict`` protocol the states and appliers use; a ``dict`` is one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Protocol

from statelog.errors import SerializationError

# (the key's type as first cached, its key bytes, its key group)
KeyInfo = tuple[type, bytes, int]
KeySetter = Callable[[Any], None]


class Table(Protocol):
    """The entries of one state in one namespace, by key (a ``dict`` is one)."""

    def get(self, key: Any, default: Any = None) -> Any: ...

    def __getitem__(self, key: Any) -> Any: ...

    def __setitem__(self, key: Any, value: Any) -> None: ...

    def __delitem__(self, key: Any) -> None: ...

    def __contains__(self, key: Any) -> bool: ...

    def __bool__(self) -> bool: ...

    def pop(self, key: Any, *default: Any) -> Any: ...

    def update(self, pairs: Iterable[tuple[Any, Any]]) -> None: ...


class StateTables(ABC):
    """The store's side of one state: its tables, one per namespace.

    The state keeps the tables it made (``{namespace bytes: table}``) and asks the store
    for a new one when a namespace appears."""

    @abstractmethod
    def new_table(self, nsb: bytes) -> Table:
        """The table of namespace ``nsb`` (encoded), made when the state first uses it."""

    def restored_namespaces(self) -> Iterable[bytes]:
        """Namespaces whose entries were loaded into the store before the state registered."""
        return ()

    @abstractmethod
    def stored(self, tables: Mapping[bytes, Table], namespaces: Mapping[bytes, Any]) -> Iterator[tuple[Any, Any, Any]]:
        """``(key, namespace, entry)`` of every stored entry (expired TTL entries too):
        ``tables`` and ``namespaces`` are the state's tables and namespace objects."""

    @abstractmethod
    def replay_table_for(self, table_for: Callable[[bytes], Table]) -> Callable[[bytes], Table]:
        """The lookup of tables a restore's replay writes to: ``table_for`` gives the table of
        a namespace for the current key; a replay writes to any key."""

    @abstractmethod
    def put_rows(
        self, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any], table_for: Callable[[bytes], Table],
    ) -> None:
        """Bulk-load restored entries by key bytes, key groups and namespace bytes."""


class WorkingSet(ABC):
    """The store of one keyed backend's states."""

    on_disk: ClassVar[bool]
    # key -> key info of the keys the backend's key setter knows (the first type seen)
    key_cache: dict[Any, KeyInfo]

    @abstractmethod
    def attach(self, ctx: Any) -> None:
        """Serve the backend whose key context is ``ctx`` (its states find the store there)."""

    @abstractmethod
    def state_tables(self, name: str, mutable: bool, ctx: Any) -> StateTables:
        """The tables of state ``name``; ``mutable``: the state changes its entries in place
        (lists, maps, entries with TTL)."""

    @abstractmethod
    def key_setter(self, ctx: Any, slow: KeySetter) -> KeySetter:
        """The backend's ``set_current_key``, which runs once per record: a key in the key
        cache sets ``ctx.key`` and ``ctx.key_info`` at once, any other key goes to ``slow``
        (which encodes it, checks its key group and calls :meth:`admit`)."""

    @abstractmethod
    def admit(self, key: Any, info: KeyInfo) -> None:
        """Put ``key``, which is not in the key cache, into it (``slow`` of :meth:`key_setter`)."""

    @abstractmethod
    def prefetch(self, keys: Iterable[Any], lo: int, hi: int) -> int:
        """A hint that records of ``keys`` (of key groups ``lo..hi``) come next: a store that
        reads entries reads theirs in one batch. Returns the number of keys read."""

    @abstractmethod
    def close(self) -> None:
        """Release what the store holds outside the process's objects."""


def unhashable_key(key: Any) -> SerializationError:
    """The error for a key the key cache cannot hold."""
    return SerializationError(
        f"cannot use an unhashable {type(key).__name__} as a key: keys must be None, bool, int, "
        "float, str, bytes, tuples of these, or types registered with register_key_type"
    )


__all__ = ["KeyInfo", "KeySetter", "StateTables", "Table", "WorkingSet", "unhashable_key"]
