"""The working-set stores: where a keyed backend's states keep their entries.

:mod:`.base` defines what the backend and the state kinds need from a store
(:class:`WorkingSet`, :class:`StateTables`); :mod:`.memory` (Python dicts) and :mod:`.disk`
(a local RocksDB database under a bounded cache) implement it.
"""

from statelog.state.tables.base import KeyInfo, StateTables, Table, WorkingSet
from statelog.state.tables.memory import MemoryStateTables, MemoryWorkingSet

__all__ = ["KeyInfo", "MemoryStateTables", "MemoryWorkingSet", "StateTables", "Table", "WorkingSet"]
