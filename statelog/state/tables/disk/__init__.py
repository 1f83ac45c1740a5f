"""The disk-backed working set: keyed state larger than memory (``state_store="disk"``).

A keyed backend opened with ``state_store="disk"`` keeps its states' entries in an embedded
RocksDB database on local disk (through ``rocksdict``) under a bounded in-memory cache of hot
entries, instead of in Python dicts. Only the working set moves: the states' API and their
change records, the changelog, checkpoints, materializations and the Parquet format are the
same as with the in-memory store (Flink's changelog backend over RocksDB instead of the heap).

The directory is a local cache, never the source of truth: it is created empty when the
backend opens (a restore fills it from the checkpoint: the materialized rows in bulk, then the
changelog tail), deleted when the backend closes, never uploaded and never reused; the
directory of a process that died is deleted by the next backend that opens under the same
parent. RocksDB checks its blocks' checksums on every read: a corrupt local file fails the
task, which restarts from its last checkpoint into a fresh directory.

Two caches sit over the database, both keyed by the key object as the in-memory tables are:
the resident keys (the default namespace, where keyed state without windows lives: plain
dicts, so the states and the C update path work as in memory) and the namespaced entries
(windows: a ``dict``-like cache per state and namespace). They are the only caches of
entries: RocksDB's point reads bypass its block cache (a key read from the database was not
among the hot keys, so its block is not worth keeping).

Modules, one role each:

* :mod:`.working_set`: :class:`DiskWorkingSet`, the store of one backend (the database, the
  states' ids and tables, bulk loads, scans, the caches' budget and figures).
* :mod:`.resident`: the resident keys (admission, prefetch, CLOCK eviction, write-back).
* :mod:`.table`: a state's tables (``DiskTable`` per namespace, the cache over them, the
  view a restore replays through).
* :mod:`.budget`: the memory budget split between the two caches.
* :mod:`.database`: RocksDB's options and the key layout (docs/format.md section 10).
* :mod:`.codec`: the database's values (plain form or pickle).
* :mod:`.miss_path`: the pure-Python reference of the C miss path
  (statelog/_ext/workingset.c).
* :mod:`.directories`: the local directories (stale ones deleted).
"""


from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from statelog.state.tables.disk.directories import DIR_PREFIX, default_state_dir

if TYPE_CHECKING:
    from statelog.state.tables.disk.working_set import DiskWorkingSet, WorkingSetError

_LAZY = ("DiskWorkingSet", "WorkingSetError")


def __getattr__(name: str) -> Any:
    """:mod:`.working_set` (and rocksdict) is imported when a disk working set is first used
    (PEP 562): a process that keeps its state in memory never loads RocksDB."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module("statelog.state.tables.disk.working_set"), name)
    globals()[name] = value
    return value


__all__ = ["DIR_PREFIX", "DiskWorkingSet", "WorkingSetError", "default_state_dir"]
