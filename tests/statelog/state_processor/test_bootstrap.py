"""Bootstrap from pyarrow: view-shaped Arrow tables become a savepoint of the canonical format
(``statelog verify`` passes) that a job restores at any parallelism; bad input is refused
naming operator, state, column and row, and then nothing is published."""

from __future__ import annotations

import pyarrow as pa
import pytest

import statelog
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statelog.errors import ConfigError
from statelog.keys.encoding import decode_key, encode_key
from statelog.layout import savepoint_prefix
from statelog.readers.restore import FAR_PAST_MS
from statelog.state_info import StateInfo
from statelog.state_processor import SavepointWriter, state_info
from statelog.state_processor.convert import Where, to_state_table
from statelog.store import open_store
from statelog.testing import FaultInjectingStore
from tests.support.s3server import RootSpec
from tests.support.state_kinds import AVG_TYPE, Avg
from tools.roots import open_root
from tools.verify import verify_root

COUNT = ValueStateDescriptor("count", pa.int64())
SEEN = ListStateDescriptor("seen", pa.string())
ATTRS = MapStateDescriptor("attrs", pa.int64(), key_type=pa.string())
AVG = statelog.AggregatingStateDescriptor("avg", AVG_TYPE, aggregate=Avg())
KEYS = [f"user-{i}" for i in range(50)]
COUNT_INFO = StateInfo.from_descriptor(COUNT)


def _write(url: str, name: str = "boot", **kw: object) -> statelog.CheckpointMetadata:
    w = SavepointWriter(url, name, max_parallelism=32, **kw)
    try:
        w.add("op", COUNT, pa.table({"key": KEYS, "value": list(range(50))}))
        w.add("op", SEEN, pa.table({"key": KEYS[:10], "value": [[f"e{i}", "x"] for i in range(10)]}))
        w.add("op", ATTRS, pa.table({"key": KEYS[:5], "value": pa.array(
            [[("a", i), ("b", -i)] for i in range(5)], pa.map_(pa.string(), pa.int64()))}))
        w.add("op", state_info("avg", "aggregating", AVG_TYPE),
              pa.table({"key": KEYS[:3], "value": [{"sum": 10, "count": i + 1} for i in range(3)]}))
        w.add("op", "__timers_event", pa.table({"key": KEYS[:4], "namespace": [None, None, 7, 7],
                                               "timestamp": [100, 200, 300, 400]}))
        return w.publish()
    finally:
        w.close()


def _entries(url: str, options: dict, which: str, parallelism: int) -> dict[str, set]:
    out: dict[str, set] = {"count": set(), "seen": set(), "attrs": set(), "avg": set(), "timers": set()}
    with statelog.open(url, store_options=options or None, create=False) as job:
        for i in range(parallelism):
            b = job.backend("op", subtask=i, parallelism=parallelism, restore=which, changelog=False,
                            clock=lambda: FAR_PAST_MS)
            for d in (COUNT, SEEN, ATTRS, AVG):
                b.get_state(d)
                out[d.name] |= {(k, ns, repr(v)) for k, ns, v in b.entries(d.name)}
            out["timers"] |= {(t.key, t.namespace, t.timestamp) for t in b.timers.timers("event")}
            b.close()
    return out


@pytest.mark.parametrize("parallelism", [1, 3])
def test_bootstrap_restores_at_any_parallelism_and_verifies(store_root: RootSpec, parallelism: int) -> None:
    meta = _write(store_root.url, store_options=store_root.options)
    assert (meta.kind, meta.savepoint, meta.max_parallelism) == ("savepoint", "boot", 32)
    with open_root(store_root.url, store_root.options) as root:
        report = verify_root(root)
    assert report.ok, report.faults
    assert report.savepoints == ["boot"] and report.table_files_checked >= 5
    got = _entries(store_root.url, store_root.options, "savepoint:boot", parallelism)
    assert got["count"] == {(k, None, repr(i)) for i, k in enumerate(KEYS)}
    assert got["seen"] == {(k, None, repr([f"e{i}", "x"])) for i, k in enumerate(KEYS[:10])}
    assert got["attrs"] == {(k, None, repr({"a": i, "b": -i})) for i, k in enumerate(KEYS[:5])}
    assert got["avg"] == {(k, None, repr({"sum": 10, "count": i + 1})) for i, k in enumerate(KEYS[:3])}
    assert got["timers"] == {("user-0", None, 100), ("user-1", None, 200), ("user-2", 7, 300), ("user-3", 7, 400)}


def test_a_restored_job_continues_and_checkpoints(file_root: RootSpec) -> None:
    _write(file_root.url)
    with statelog.open(file_root.url, create=False) as job:
        b = job.backend("op", subtask=1, parallelism=2, restore="savepoint:boot")
        job.backend("op", subtask=0, parallelism=2, restore="savepoint:boot").get_state(COUNT)
        count = b.get_state(COUNT)
        key = next(k for k in KEYS if statelog.subtask_for_key_group(32, 2, statelog.key_group_of(k, 32)) == 1)
        b.set_current_key(key)
        before = count.value()
        count.update(before + 1)
        meta = job.checkpoint(sources={"n": 1})
    with statelog.open(file_root.url, create=False) as job:
        b = job.backend("op", subtask=0, parallelism=1, restore=meta.checkpoint_id, changelog=False)
        count = b.get_state(COUNT)
        b.set_current_key(key)
        assert count.value() == before + 1
        b.set_current_key("user-0")
        assert count.value() == 0


BAD = [
    ("duplicate", COUNT, pa.table({"key": ["a", "b", "a"], "value": [1, 2, 3]}),
     "operator 'op', state 'count', column 'key': duplicate key 'a' in namespace None (rows 0 and 2)"),
    ("null key", COUNT, pa.table({"key": ["a", None], "value": [1, 2]}),
     "operator 'op', state 'count', column 'key': null key"),
    ("null value", COUNT, pa.table({"key": ["a", "b"], "value": [1, None]}),
     "operator 'op', state 'count', column 'value': null value (a state holds no null value: leave the row out) (row 1)"),
    ("overflow", ValueStateDescriptor("small", pa.int8()), pa.table({"key": ["a", "b"], "value": [1, 300]}),
     "operator 'op', state 'small', column 'value': value 300 does not fit the state's type int8 (row 1)"),
    ("wrong type", COUNT, pa.table({"key": ["a"], "value": ["1"]}),
     "operator 'op', state 'count', column 'value': has type string, the state holds int64; cast the column explicitly"),
    ("missing value", COUNT, pa.table({"key": ["a"]}), "operator 'op', state 'count', column 'value': missing"),
    ("null element", SEEN, pa.table({"key": ["a"], "value": [["x", None]]}),
     "operator 'op', state 'seen', column 'value': null element"),
    ("empty list", SEEN, pa.table({"key": ["a"], "value": pa.array([[]], pa.list_(pa.string()))}),
     "operator 'op', state 'seen', column 'value': empty list"),
    ("expiry without ttl", COUNT, pa.table({"key": ["a"], "value": [1], "expires_ms": [5]}),
     "operator 'op', state 'count', column 'expires_ms': the state has no TTL"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_refused_naming_operator_state_column_and_row(file_root: RootSpec, case: tuple) -> None:
    _, desc, table, message = case
    with SavepointWriter(file_root.url, "bad", max_parallelism=32) as w:
        w.add("op", ATTRS, pa.table({"key": ["ok"], "value": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64()))}))
        with pytest.raises(ConfigError) as e:
            w.add("op", desc, table)
        assert message in str(e.value)
    store = open_store(file_root.url)
    try:
        assert list(store.list("")) == []  # not even job.json: nothing was published
    finally:
        store.close()


def test_unknown_kind_and_existing_name_are_refused(file_root: RootSpec) -> None:
    with pytest.raises(ConfigError, match="unknown state kind 'set'; expected one of value, list, map"):
        state_info("s", "set", pa.int64())
    _write(file_root.url)
    with pytest.raises(ConfigError, match="savepoint 'boot' already exists"):
        SavepointWriter(file_root.url, "boot")
    with pytest.raises(ConfigError, match="max_parallelism 32, not 64"):
        SavepointWriter(file_root.url, "other", max_parallelism=64)


def test_a_failed_write_publishes_nothing_and_leaves_nothing(file_root: RootSpec) -> None:
    inner = open_store(file_root.url)
    store = FaultInjectingStore(inner)
    calls: list[str] = []

    def fail_third(_op: str, key: str) -> None:
        calls.append(key)
        if len([k for k in calls if k.endswith(".parquet")]) == 3:
            raise statelog.errors.StoreError("injected", key=key)

    store.before("put", fail_third)
    w = SavepointWriter(file_root.url, "broken", max_parallelism=32, store=store)
    w.add("op", COUNT, pa.table({"key": KEYS, "value": list(range(50))}))
    with pytest.raises(statelog.errors.StatelogError):
        w.publish()
    assert list(inner.list(savepoint_prefix("broken"))) == []
    inner.close()


def test_integer_keys_are_encoded_in_bulk_exactly_as_encode_key() -> None:
    keys = [0, 1, -1, 2**63 - 1, -(2**63), 42, -5]
    table = to_state_table(COUNT_INFO, pa.table({"key": pa.array(keys, pa.int64()), "value": keys}), 32, Where("op", "count"))
    assert sorted(table.column("key").to_pylist()) == sorted(encode_key(k) for k in keys)
    assert table.column("key_group").to_pylist() == [statelog.key_group_of(decode_key(b), 32)
                                                     for b in table.column("key").to_pylist()]
    small = to_state_table(COUNT_INFO, pa.table({"key": pa.array([3, -3], pa.int8()), "value": [1, 2]}), 32,
                           Where("op", "count"))
    assert sorted(small.column("key").to_pylist()) == sorted([encode_key(3), encode_key(-3)])
