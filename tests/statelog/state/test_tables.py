"""The working-set stores (statelog/state/tables): the memory and the disk store behind the
same protocol give the states the same entries, for the per-record key setter, bulk loads
and a restore's replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.changelog.ops import Op
from statelog.errors import SerializationError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes
from statelog.state.backend import KeyedStateBackend
from statelog.state.tables import MemoryWorkingSet, WorkingSet
from statelog.state.tables.disk import DiskWorkingSet

MAXP = 16


def _store(kind: str, tmp_path: Path) -> WorkingSet:
    if kind == "memory":
        return MemoryWorkingSet(key_cache_limit=4)  # cleared often: every 4 new keys
    return DiskWorkingSet(32 << 20, str(tmp_path / "ws"), MAXP, cache_entries=4)  # evicts often


@pytest.fixture(params=["memory", "disk"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    b = KeyedStateBackend(operator_uid="op", max_parallelism=MAXP, working_set=_store(request.param, tmp_path))
    yield b
    b.close()


def _view(b: KeyedStateBackend, name: str) -> list[tuple[str, str, str]]:
    return sorted((repr(k), repr(ns), repr(v)) for k, ns, v in b.entries(name))


def test_the_key_setter_of_either_store_scopes_states_to_the_key(backend: KeyedStateBackend) -> None:
    """Keys come and go from the key cache (a memory cache of 4 keys, a disk store of 4
    resident keys): every key's entries stay, keys equal across types (1, True, 1.0) are one
    key, and an unhashable key is refused clearly."""
    v = backend.get_state(ValueStateDescriptor("v", pa.int64(), default=0))
    keys: list[Any] = [*range(20), "a", ("t", 1), 1, True, 1.0, "a"]
    for k in keys * 3:
        backend.set_current_key(k)
        v.update(v.value() + 1)
    assert backend.on_disk == isinstance(backend._working_set, DiskWorkingSet)
    want = {repr(k): 3 * sum(1 for x in keys if x == k) for k in [*range(20), "a", ("t", 1)]}
    assert {k: int(val) for k, _ns, val in _view(backend, "v")} == want
    with pytest.raises(SerializationError, match="cannot use an unhashable list as a key"):
        backend.set_current_key([1, 2])
    backend.set_current_key(True)  # a bool key equal to the int key 1: the int key's entry
    assert backend.current_key is True and v.value() == want["1"]


def test_bulk_loaded_rows_read_the_same_in_either_store(backend: KeyedStateBackend) -> None:
    """put_rows loads rows by key bytes into a state's tables (the memory store decodes the
    keys, the disk store writes the database): the same entries in every namespace."""
    m = backend.get_state(MapStateDescriptor("m", key_type=pa.string(), value_type=pa.int64()))
    rows = [(k, ns) for k in range(30) for ns in (None, (k % 3, "w"))]
    kbs = [encode_key(k) for k, _ns in rows]
    m.put_rows(kbs, [key_group_of_bytes(kb, MAXP) for kb in kbs], [encode_key(ns) for _k, ns in rows],
               [{"x": k, "ns": 0 if ns is None else 1} for k, ns in rows])  # fmt: skip
    want = sorted((repr(k), repr(ns), repr({"x": k, "ns": 0 if ns is None else 1})) for k, ns in rows)
    assert _view(backend, "m") == want
    backend.set_current_key(7)
    m.set_namespace((1, "w"))
    assert dict(m.items()) == {"x": 7, "ns": 1}


def test_a_replay_writes_to_any_key_in_either_store(backend: KeyedStateBackend) -> None:
    """apply_many replays records of keys that are not current (the disk store makes each
    resident first) into the default namespace and into windows."""
    lst = backend.get_state(ListStateDescriptor("l", pa.int64()))
    backend.set_current_key(0)  # a current key the records do not touch
    records = []
    for i in range(40):
        k, ns = i % 10, (None if i % 4 else (i % 2, "w"))
        records.append((encode_key(k), encode_key(ns), Op.LIST_APPEND.value, None, [i], None))
    lst.apply_many(records, {encode_key(k): k for k in range(10)})
    want: dict[tuple[Any, Any], list[int]] = {}
    for i in range(40):
        want.setdefault((i % 10, None if i % 4 else (i % 2, "w")), []).append(i)
    assert _view(backend, "l") == sorted((repr(k), repr(ns), repr(v)) for (k, ns), v in want.items())
