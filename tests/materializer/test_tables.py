"""Acceptance tests of the materialized state tables.

A job at parallelism 2 writes every state kind of ``tests.support.harness`` (typed int64 and
string values, list, map, reducing, pickled aggregating and value state, TTL value) plus
event- and processing-time timers, checkpoints, and the materializer writes the Parquet
tables of that checkpoint. The tests then

* read the tables with plain ``pyarrow.parquet`` and with DuckDB (no statelog code on the
  reading side: the manifest is parsed as JSON, keys are compared as the canonical bytes of
  ``statelog.keys.encoding.encode_key``) and compare them with the reference model;
* check the layout: sort order ``(key_group, key, namespace)``, every row inside its file's
  key-group range, and the manifest's rows / bytes / CRC-32 against the objects;
* check that an incremental materialization reuses the files of untouched key groups;
* corrupt a table file, delete one, delete the manifest: restore fails with an error that
  names the object;
* restore a checkpoint that builds on a materialization plus a changelog tail at
  parallelism 1, 3 and 4 and compare with the live state.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import statelog
from materializer.build import materialize
from statelog.errors import CorruptionError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of, key_group_of_bytes, subtask_for_key_group
from tests.support.harness import (
    DESCRIPTORS,
    Clock,
    Driver,
    Model,
    assert_state_equal,
    backend_timers,
    backend_view,
    register_all,
)
from tests.support.s3server import RootSpec

MAXP = 32
UID = "op"
TIMER_TABLES = {"event": "__timers_event", "processing": "__timers_processing"}
KEYS: list[Any] = (
    list(range(-10, 60))
    + [f"user-{i}" for i in range(40)]
    + [(i, "x") for i in range(15)]
    + [b"k\x00" + bytes([i]) for i in range(15)]
    + [i + 0.5 for i in range(8)]
    + [None, "", b"", 2**70]
)
NAMESPACES: list[Any] = [None, None, (0, 10), (10, 20), "w"]
TEXTS = ["", "a", "bb", "héllo", "日本", "x" * 30]


# -- a multi-subtask driver over the harness ------------------------------------------------------


class Router:
    """Routes harness operations to the subtask owning the current key (one shared model)."""

    def __init__(self, job: Any, parallelism: int, model: Model, clock: Clock) -> None:
        self.parallelism = parallelism
        self.drivers = [
            Driver(job.backend(UID, subtask=i, parallelism=parallelism, clock=clock), model, clock)
            for i in range(parallelism)
        ]
        self.model, self.clock = model, clock
        self.ns: Any = None
        self.cur = self.drivers[0]

    def apply(self, op: tuple) -> None:
        if op[0] == "key":
            kg = key_group_of(op[1], MAXP)
            self.cur = self.drivers[subtask_for_key_group(MAXP, self.parallelism, kg)]
            self.cur.set_key(op[1])
            self.cur.set_ns(self.ns)
        elif op[0] == "ns":
            self.ns = op[1]
            self.cur.set_ns(op[1])
        else:
            self.cur.apply(op)


def random_ops(rng: random.Random, n: int, keys: list[Any] = KEYS) -> list[tuple]:
    """``n`` operations (each on a fresh key and namespace) over every state kind and timers."""
    ops: list[tuple] = []
    for _ in range(n):
        ops.append(("key", rng.choice(keys)))
        ops.append(("ns", rng.choice(NAMESPACES)))
        r = rng.random()
        small = rng.randint(-5, 100)
        if r < 0.12:
            ops.append(("value_rmw", small))
        elif r < 0.15:
            ops.append(("value_clear",))
        elif r < 0.22:
            ops.append(("text", rng.choice(TEXTS)))
        elif r < 0.32:
            ops.append(("list_add", rng.choice(TEXTS)))
        elif r < 0.36:
            ops.append(("list_update", [rng.choice(TEXTS) for _ in range(rng.randint(0, 3))]))
        elif r < 0.38:
            ops.append(("list_clear",))
        elif r < 0.48:
            ops.append(("map_put", rng.choice("pqrs"), small))
        elif r < 0.52:
            ops.append(("map_remove", rng.choice("pqrs")))
        elif r < 0.58:
            ops.append(("sum", small))
        elif r < 0.64:
            ops.append(("avg", small))
        elif r < 0.72:
            ops.append(("ttl_put", small))
        elif r < 0.78:
            ops.append(("obj", {rng.choice("xyz"): [small] * rng.randint(0, 2)}))
        elif r < 0.80:
            ops.append(("tick", rng.randint(1, 30)))
        elif r < 0.94:
            ops.append(("timer_add", rng.choice(["event", "processing"]), rng.randint(0, 300)))
        else:
            ops.append(("timer_del", rng.choice(["event", "processing"]), rng.randint(0, 300)))
    return ops


def open_job(spec: Any) -> Any:
    job = statelog.open(
        spec.url, store_options=spec.options, max_parallelism=MAXP, writer_options={"persist_delay": 0.005}
    )
    job.materialization_poll_s = 0
    return job


def local_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


# -- plain readers: JSON + pyarrow.parquet, no statelog -------------------------------------------


def read_manifest(root: Path, key: str) -> dict[str, Any]:
    wrapped = json.loads((root / key).read_bytes())
    body = wrapped["body"]
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert zlib.crc32(canon) == wrapped["crc32"]
    return body


def decoded_rows(name: str, table: pa.Table) -> dict[tuple[bytes, bytes], Any]:
    """``{(key bytes, namespace bytes): value}`` of one state table, as a foreign reader sees it."""
    meta = table.schema.metadata or {}
    assert meta[b"statelog.state"] == name.encode()
    pickled = meta.get(b"statelog.value_encoding") == b"pickle"
    out: dict[tuple[bytes, bytes], Any] = {}
    for row in table.to_pylist():
        k = (row["key"], row["namespace"])
        assert k not in out, f"duplicate row {k} in {name}"
        v = row["value"]
        if pickled:
            v = pickle.loads(v)
        if isinstance(table.schema.field("value").type, pa.MapType):
            v = dict(v)
        out[k] = (v, row["expires_ms"]) if name == "ttl" else v
    return out


def expected_rows(model: Model, name: str) -> dict[tuple[bytes, bytes], Any]:
    return {(encode_key(k), encode_key(ns)): v for (k, ns), v in model.tables[name].items()}


def expected_timers(model: Model, domain: str) -> set[tuple[bytes, bytes, int]]:
    return {(encode_key(k), encode_key(ns), ts) for d, ts, k, ns in model.timers if d == domain}


def expected_schema(name: str) -> dict[str, pa.DataType]:
    return {
        "value": pa.int64(),
        "text": pa.string(),
        "sum": pa.int64(),
        "ttl": pa.int64(),
        "avg": pa.binary(),
        "obj": pa.binary(),
        "list": pa.list_(pa.string()),
        "map": pa.map_(pa.string(), pa.int64()),
    }[name]


# -- fixtures ----------------------------------------------------------------------------------


class Scenario:
    """Checkpoint 1 (materialized as ``m1``), more changes, checkpoint 2 on ``m1`` + tail."""

    def __init__(self, spec: Any, n1: int = 700, n2: int = 250, seed: int = 3) -> None:
        rng = random.Random(seed)
        self.spec = spec
        self.clock = Clock()
        self.model = Model()
        self.job = open_job(spec)
        self.router = Router(self.job, 2, self.model, self.clock)
        for op in random_ops(rng, n1):
            self.router.apply(op)
        self.meta1 = self.job.checkpoint(sources={"offset": 1})
        self.model1 = self.model.copy()
        self.now1 = self.clock.now
        self.m1 = materialize(self.job.store, self.meta1)
        for op in random_ops(rng, n2):
            self.router.apply(op)
        self.meta2 = self.job.checkpoint(sources={"offset": 2})
        self.model2 = self.model.copy()
        self.now2 = self.clock.now

    def close(self) -> None:
        self.job.close()


@pytest.fixture(scope="module")
def tables_root(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One materialized scenario on ``file://`` shared by the read-only table tests."""
    spec = RootSpec((tmp_path_factory.mktemp("tables") / "root").as_uri(), {})
    sc = Scenario(spec)
    yield sc
    sc.close()


def manifest_files(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return body["operators"][UID]["files"].get(name, [])


# -- tests: read with pyarrow ---------------------------------------------------------------------


def test_tables_read_with_pyarrow_equal_model(tables_root: Scenario) -> None:
    sc = tables_root
    root = local_path(sc.spec.url)
    body = read_manifest(root, sc.m1.key)
    assert body["format"] == "statelog.materialization" and body["checkpoint_id"] == sc.meta1.checkpoint_id
    assert body["max_parallelism"] == MAXP
    assert set(body["operators"]) == {UID}
    # every state kind is there
    assert set(body["operators"][UID]["files"]) == set(DESCRIPTORS) | set(TIMER_TABLES.values())
    for name in DESCRIPTORS:
        files = manifest_files(body, name)
        tables = [pq.read_table(root / f["path"]) for f in files]
        for t in tables:
            assert t.schema.field("value").type == expected_schema(name), name
            assert t.schema.field("key_group").type == pa.int32()
        got: dict[tuple[bytes, bytes], Any] = {}
        for t in tables:
            rows = decoded_rows(name, t)
            assert not rows.keys() & got.keys()
            got.update(rows)
        want = expected_rows(sc.model1, name)
        assert got == want, f"state {name!r}: table differs from the model"
        if name != "ttl":
            assert all(t.column("expires_ms").null_count == t.num_rows for t in tables), name
    # TTL rows carry the absolute expiry time, and at least one entry is expired by now
    ttl = expected_rows(sc.model1, "ttl")
    assert ttl and any(exp <= sc.now1 for _, exp in ttl.values())
    for domain, name in TIMER_TABLES.items():
        got_t: set[tuple[bytes, bytes, int]] = set()
        n = 0
        for f in manifest_files(body, name):
            t = pq.read_table(root / f["path"])
            assert t.schema.names == ["key_group", "key", "namespace", "timestamp"]
            n += t.num_rows
            got_t |= {(r["key"], r["namespace"], r["timestamp"]) for r in t.to_pylist()}
        assert n == len(got_t)
        assert got_t == expected_timers(sc.model1, domain), f"{name} differs from the model"


def test_layout_sorted_ranges_and_manifest_checksums(tables_root: Scenario) -> None:
    sc = tables_root
    root = local_path(sc.spec.url)
    body = read_manifest(root, sc.m1.key)
    listed = set()
    for name, files in body["operators"][UID]["files"].items():
        prev_end = -1
        for f in files:
            lo, hi = f["key_groups"]
            assert prev_end < lo <= hi < MAXP, (name, f["key_groups"], prev_end)
            prev_end = hi
            data = (root / f["path"]).read_bytes()
            assert len(data) == f["bytes"], f["path"]
            assert zlib.crc32(data) == f["crc32"], f["path"]
            pf = pq.ParquetFile(root / f["path"])
            assert pf.metadata.num_rows == f["rows"], f["path"]
            t = pf.read()
            rows = t.to_pylist()
            sort_key = ["key_group", "key", "namespace"] + (["timestamp"] if name.startswith("__") else [])
            keys = [tuple(r[c] for c in sort_key) for r in rows]
            assert keys == sorted(keys), f"{f['path']} is not sorted by {sort_key}"
            assert len(set(keys)) == len(keys)
            for r in rows:
                assert lo <= r["key_group"] <= hi, (f["path"], r["key_group"])
                assert r["key_group"] == key_group_of_bytes(r["key"], MAXP)
            listed.add(f["path"])
    # every data object of this materialization is listed in its manifest
    data_dir = root / "materializations" / "data" / body["id"]
    on_disk = {str(p.relative_to(root)) for p in data_dir.rglob("*") if p.is_file()}
    assert on_disk == listed
    stats = body["stats"]
    assert stats["rows"] == sum(
        f["rows"] for fs in body["operators"][UID]["files"].values() for f in fs
    )
    assert stats["files_written"] == len(listed) and stats["files_reused"] == 0


def test_tables_read_with_duckdb(tables_root: Scenario) -> None:
    duckdb = pytest.importorskip("duckdb")
    sc = tables_root
    root = local_path(sc.spec.url)
    body = read_manifest(root, sc.m1.key)
    con = duckdb.connect()

    def paths(name: str) -> list[str]:
        return [str(root / f["path"]) for f in manifest_files(body, name)]

    def query(sql: str, name: str) -> list[tuple]:
        return con.execute(sql.replace("$T", "read_parquet($files)"), {"files": paths(name)}).fetchall()

    for name in ("value", "text", "sum"):
        rows = query("SELECT key, namespace, value FROM $T ORDER BY key_group, key, namespace", name)
        assert {(bytes(k), bytes(ns)): v for k, ns, v in rows} == expected_rows(sc.model1, name), name
        # the files' order is the sort order DuckDB computes
        plain = query("SELECT key, namespace FROM $T", name)
        assert [tuple(map(bytes, r)) for r in plain] == [(bytes(k), bytes(ns)) for k, ns, _ in rows]
    total, count = query("SELECT sum(value), count(*) FROM $T", "value")[0]
    assert (total, count) == (sum(sc.model1.tables["value"].values()), len(sc.model1.tables["value"]))
    rows = query("SELECT key, namespace, value, expires_ms FROM $T", "ttl")
    assert {(bytes(k), bytes(ns)): (v, x) for k, ns, v, x in rows} == expected_rows(sc.model1, "ttl")
    live = query(f"SELECT count(*) FROM $T WHERE expires_ms > {sc.now1}", "ttl")[0][0]
    assert live == len(sc.model1.visible(sc.now1)["ttl"])
    rows = query("SELECT key, namespace, value FROM $T", "list")
    assert {(bytes(k), bytes(ns)): list(v) for k, ns, v in rows} == expected_rows(sc.model1, "list")
    rows = query("SELECT key, namespace, map_keys(value), map_values(value) FROM $T", "map")
    got = {(bytes(k), bytes(ns)): dict(zip(ks, vs, strict=True)) for k, ns, ks, vs in rows}
    assert got == expected_rows(sc.model1, "map")
    rows = query("SELECT key, namespace, value FROM $T", "obj")
    assert {(bytes(k), bytes(ns)): pickle.loads(v) for k, ns, v in rows} == expected_rows(sc.model1, "obj")
    for domain, name in TIMER_TABLES.items():
        rows = query("SELECT key, namespace, timestamp FROM $T", name)
        assert {(bytes(k), bytes(ns), ts) for k, ns, ts in rows} == expected_timers(sc.model1, domain)
    # key-group pruning across files: one key group, via the key_group column
    kg = key_group_of(KEYS[0], MAXP)
    rows = query(f"SELECT key, namespace, value FROM $T WHERE key_group = {kg}", "value")
    want = {k: v for k, v in expected_rows(sc.model1, "value").items() if key_group_of_bytes(k[0], MAXP) == kg}
    assert {(bytes(k), bytes(ns)): v for k, ns, v in rows} == want


# -- incremental materialization ----------------------------------------------------------------


def test_incremental_materialization_reuses_untouched_files(file_root: Any) -> None:
    clock, model = Clock(), Model()
    job = open_job(file_root)
    try:
        router = Router(job, 1, model, clock)
        rng = random.Random(11)
        for op in random_ops(rng, 500):
            router.apply(op)
        meta1 = job.checkpoint(sources={"offset": 1})
        m1 = materialize(job.store, meta1)
        # change a few keys of one key group only (value state and event timers)
        kg = key_group_of(KEYS[5], MAXP)
        few = [k for k in KEYS if key_group_of(k, MAXP) == kg][:3]
        assert few
        for i, k in enumerate(few):
            for op in (("key", k), ("ns", None), ("value_rmw", 1000 + i), ("timer_add", "event", 9000 + i)):
                router.apply(op)
        meta2 = job.checkpoint(sources={"offset": 2})
        assert meta2.manifest_keys() == {m1.key}, "checkpoint 2 does not build on the materialization"
        m2 = materialize(job.store, meta2)
        stats = m2.stats
        assert stats["files_reused"] > 0 and stats["files_written"] > 0
        old = {(name, f.key_groups): f for name, fs in m1.operators[UID].files.items() for f in fs}
        written, reused = 0, 0
        for name, fs in m2.operators[UID].files.items():
            for f in fs:
                touched = kg in f.key_groups and name in ("value", "__timers_event")
                if touched:
                    assert f.path.startswith(f"materializations/data/{m2.mid}/"), f.path
                    written += 1
                else:
                    assert f == old[(name, f.key_groups)], f"{name} {f.key_groups} was not reused"
                    reused += 1
        assert written == stats["files_written"] == 2
        assert reused == stats["files_reused"]
        assert stats["changelog_records"] == 2 * len(few)
        # the reused files are the old objects: nothing was rewritten under the new id
        new_objs = [o.key for o in job.store.list(f"materializations/data/{m2.mid}/")]
        assert len(new_objs) == 2
        # and checkpoint 3, on m2 alone, restores to the model
        meta3 = job.checkpoint(sources={"offset": 3})
        assert meta3.manifest_keys() == {m2.key}
        check_restore(file_root, meta3.checkpoint_id, [1, 2], model, clock.now)
    finally:
        job.close()


# -- restore ----------------------------------------------------------------------------------


def check_restore(spec: Any, cid: int, parallelisms: list[int], model: Model, now: int) -> list[Any]:
    """Restore checkpoint ``cid`` at each parallelism; the union of the subtasks equals ``model``."""
    job = statelog.open(spec.url, store_options=spec.options, create=False)
    reads = []
    try:
        meta = job.load_checkpoint(cid)
        for p in parallelisms:
            views: dict[str, dict] = {name: {} for name in DESCRIPTORS}
            timers: set = set()
            for i in range(p):
                b = job.backend(UID, subtask=i, parallelism=p, restore=meta, changelog=False, clock=lambda: now)
                states = register_all(b)
                for name, view in backend_view(b, states).items():
                    assert not view.keys() & views[name].keys()
                    views[name].update(view)
                timers |= backend_timers(b)
                reads.append(job.read_restored(meta, UID, b.key_groups))
            want = model.visible(now)
            for name in DESCRIPTORS:
                assert views[name] == want[name], f"parallelism {p}: state {name!r} differs"
            assert timers == model.timers, f"parallelism {p}: timers differ"
    finally:
        job.close()
    return reads


@pytest.mark.parametrize("parallelism", [1, 3, 4])
def test_restore_from_materialization_and_tail(store_root: Any, parallelism: int) -> None:
    sc = Scenario(store_root, n1=400, n2=150, seed=parallelism)
    try:
        assert sc.meta2.manifest_keys() == {sc.m1.key}
        # the live state (both live subtasks) is the model
        live: dict[str, dict] = {name: {} for name in DESCRIPTORS}
        for d in sc.router.drivers:
            for name, view in backend_view(d.backend, d.states).items():
                live[name].update(view)
        assert live == sc.model2.visible(sc.now2)
        reads = check_restore(sc.spec, sc.meta2.checkpoint_id, [parallelism], sc.model2, sc.now2)
        # the restore read the materialized base and replayed a tail on top of it
        assert sum(r.base_rows for r in reads) == sc.m1.rows
        assert sum(r.records_read for r in reads) > 0
        # checkpoint 1, materialized but restored from its changelog, agrees as well
        check_restore(sc.spec, sc.meta1.checkpoint_id, [parallelism], sc.model1, sc.now2)
    finally:
        sc.close()


def test_restore_single_backend_matches_harness(file_root: Any) -> None:
    """The harness's own comparison (states and timers) after a restore at parallelism 1."""
    sc = Scenario(file_root, n1=200, n2=100, seed=9)
    try:
        job = statelog.open(file_root.url, create=False)
        try:
            b = job.backend(UID, restore=sc.meta2.checkpoint_id, changelog=False, clock=lambda: sc.now2)
            assert_state_equal(b, register_all(b), sc.model2, sc.now2)
        finally:
            job.close()
    finally:
        sc.close()


# -- corruption ---------------------------------------------------------------------------------


def _restore(spec: Any, cid: int, on_demand: bool = False) -> None:
    """Restore every state of ``cid``: eagerly, or on demand until every key group loaded."""
    job = statelog.open(spec.url, store_options=spec.options, create=False)
    try:
        b = job.backend(UID, restore=cid, changelog=False, on_demand=on_demand)
        register_all(b)
        b.wait_loaded()
    finally:
        job.close()


def _replace(store: Any, key: str, data: bytes) -> None:
    store.delete(key)
    store.put(key, data)


def test_corrupt_table_file_fails_restore_naming_it(store_root: Any) -> None:
    sc = Scenario(store_root, n1=150, n2=40, seed=5)
    try:
        store = sc.job.store
        victim = sc.m1.operators[UID].files["map"][0]
        data = bytearray(store.get(victim.path))
        pos = len(data) // 2
        data[pos] ^= 0x40
        _replace(store, victim.path, bytes(data))
        for on_demand in (False, True):  # eager: when the backend opens; on demand: when loading
            with pytest.raises(CorruptionError) as ei:
                _restore(store_root, sc.meta2.checkpoint_id, on_demand)
            assert victim.path in str(ei.value) and ei.value.key == victim.path
        # a truncated file: also named
        _replace(store, victim.path, bytes(data[: len(data) - 7]))
        for on_demand in (False, True):
            with pytest.raises(CorruptionError) as ei:
                _restore(store_root, sc.meta2.checkpoint_id, on_demand)
            assert victim.path in str(ei.value)
        # a missing file: named too
        store.delete(victim.path)
        for on_demand in (False, True):
            with pytest.raises(CorruptionError) as ei:
                _restore(store_root, sc.meta2.checkpoint_id, on_demand)
            assert victim.path in str(ei.value) and "missing" in str(ei.value)
        # checkpoint 1 does not depend on the materialization: it still restores
        _restore(store_root, sc.meta1.checkpoint_id)
        _restore(store_root, sc.meta1.checkpoint_id, True)
    finally:
        sc.close()


def test_missing_manifest_is_a_clear_error(store_root: Any) -> None:
    sc = Scenario(store_root, n1=100, n2=30, seed=6)
    try:
        sc.job.store.delete(sc.m1.key)
        with pytest.raises(CorruptionError) as ei:
            _restore(store_root, sc.meta2.checkpoint_id)
        msg = str(ei.value)
        assert sc.m1.key in msg and "missing" in msg, msg
        assert ei.value.key == sc.m1.key
    finally:
        sc.close()


def test_corrupt_manifest_is_a_clear_error(file_root: Any) -> None:
    sc = Scenario(file_root, n1=100, n2=30, seed=7)
    try:
        store = sc.job.store
        data = bytearray(store.get(sc.m1.key))
        i = data.index(b'"rows":') + 7
        data[i] = ord("9") if data[i] != ord("9") else ord("8")
        _replace(store, sc.m1.key, bytes(data))
        with pytest.raises(CorruptionError) as ei:
            _restore(file_root, sc.meta2.checkpoint_id)
        assert sc.m1.key in str(ei.value) and "checksum" in str(ei.value)
    finally:
        sc.close()


def test_row_groups_end_at_key_group_ends_and_a_reader_decodes_only_its_key_groups() -> None:
    """A key group of MIN_ROW_GROUP_ROWS rows or more has row groups of its own (at most
    row_group_rows each), also when smaller key groups come before it; smaller key groups share one; decode_table_file with ``only``
    reads just the row groups holding those key groups."""
    import numpy as np

    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.manifest import TableFile
    from statelog.materialization.table_reader import decode_table_file
    from statelog.materialization.table_schema import (
        MIN_ROW_GROUP_ROWS,
        encode_parquet,
        row_group_bounds,
    )

    big = MIN_ROW_GROUP_ROWS + 100
    sizes = [big, 10, 20, big, 2 * big, 5]  # key groups 0..5
    kgs = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    assert row_group_bounds(kgs, 65_536) == [
        (0, big), (big, big + 30), (big + 30, 2 * big + 30), (2 * big + 30, 4 * big + 30), (4 * big + 30, 4 * big + 35),
    ]  # fmt: skip
    assert row_group_bounds(np.repeat(np.int32(7), 10), 4) == [(0, 4), (4, 8), (8, 10)]
    n = len(kgs)
    table = pa.table({
        "key_group": pa.array(kgs, pa.int32()),
        "key": pa.array([encode_key(i) for i in range(n)], pa.binary()),
        "namespace": pa.array([encode_key(None)] * n, pa.binary()),
        "value": pa.array(range(n), pa.int64()),
    })  # fmt: skip
    data = encode_parquet(table, row_group_rows=65_536)
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    stats = [(md.row_group(i).column(0).statistics.min, md.row_group(i).column(0).statistics.max) for i in range(md.num_row_groups)]
    assert stats == [(0, 0), (1, 2), (3, 3), (4, 4), (5, 5)]
    f = TableFile("t.parquet", KeyGroupRange(0, 5), n, len(data), zlib.crc32(data))
    assert decode_table_file(data, f, KeyGroupRange(0, 5)).equals(table)
    got = decode_table_file(data, f, KeyGroupRange(0, 4), only=[0, 4])
    assert got.column("value").to_pylist() == list(range(big)) + list(range(2 * big + 30, 4 * big + 30))
    # the row group of key groups 1-3 is not even read: corrupt its value page, only=[0, 4] still reads
    col = md.row_group(1).column(3)
    bad = bytearray(data)
    bad[col.data_page_offset + col.total_compressed_size - 8] ^= 0xFF
    with pytest.raises(CorruptionError):
        decode_table_file(bytes(bad), f, KeyGroupRange(0, 5))
    assert decode_table_file(bytes(bad), f, KeyGroupRange(0, 4), only=[0, 4]).equals(got)
    assert encode_parquet(table.slice(0, 0))  # an empty table still makes a valid file
    assert pq.ParquetFile(pa.BufferReader(encode_parquet(table.slice(0, 0)))).metadata.num_rows == 0


def test_key_slices_cut_a_large_key_group_and_decode_key_range_reads_only_its_row_groups() -> None:
    """A key group of several row groups of its own is cut into slices at their smallest
    keys; decode_key_range decodes only the row groups that may hold a key range (a key whose
    namespaces span two row groups is found in both), and a file without statistics on
    ``key`` (written before them) is not sliced."""

    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.key_slices import decode_key_range, key_slices
    from statelog.materialization.manifest import TableFile
    from statelog.materialization.table_schema import encode_parquet

    # key group 3: keys 0..99, three namespaces each (300 rows), row groups of 64 rows, so
    # some keys' namespaces are cut apart; key groups 2 and 4 of 5 rows around it
    rows = [(2, encode_key(-i), encode_key(None)) for i in range(1, 6)]
    rows += sorted((3, encode_key(k), encode_key(ns)) for k in range(100) for ns in range(3))
    rows += [(4, encode_key(-i), encode_key(None)) for i in range(1, 6)]
    n = len(rows)
    table = pa.table({
        "key_group": pa.array([r[0] for r in rows], pa.int32()),
        "key": pa.array([r[1] for r in rows], pa.binary()),
        "namespace": pa.array([r[2] for r in rows], pa.binary()),
        "value": pa.array(range(n), pa.int64()),
    })  # fmt: skip
    data = encode_parquet(table, row_group_rows=64, min_row_group_rows=100)
    f = TableFile("t.parquet", KeyGroupRange(2, 4), n, len(data), zlib.crc32(data))
    bounds = key_slices(data, f, 3)
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    own = [i for i in range(md.num_row_groups) if md.row_group(i).column(0).statistics.min == 3]
    assert len(own) == 5 and len(bounds) == 4 and bounds == sorted(bounds)
    assert key_slices(data, f, 2) == [] and key_slices(data, f, 4) == []  # one row group each
    kg3 = [(r[1], v) for v, r in enumerate(rows) if r[0] == 3]
    edges = [None, *bounds, None]
    got_all = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        part = decode_key_range(data, f, 3, lo, hi)
        keys = part.column("key").to_pylist()
        assert set(part.column("key_group").to_pylist()) == {3}
        assert all((lo is None or k >= lo) and (hi is None or k < hi) for k in keys)
        got_all += list(zip(keys, part.column("value").to_pylist(), strict=True))
    assert sorted(got_all) == sorted(kg3)  # the slices partition the key group's rows
    # a key whose namespaces span two row groups: its rows are all in the slice it starts
    stats = [md.row_group(i).column(1).statistics for i in own]
    assert any(a.max == b.min for a, b in zip(stats, stats[1:], strict=False))  # (so the check above covers it)
    # only the row groups that may hold a range are decoded: corrupt the last own row group's
    # value column, the first slice still reads
    col = md.row_group(own[-1]).column(3)
    bad = bytearray(data)
    bad[col.data_page_offset + col.total_compressed_size - 8] ^= 0xFF
    assert decode_key_range(bytes(bad), f, 3, None, bounds[0]).num_rows == decode_key_range(data, f, 3, None, bounds[0]).num_rows
    with pytest.raises(CorruptionError):
        decode_key_range(bytes(bad), f, 3, bounds[-1], None)
    # a file without statistics on key: not sliced, and a key range still reads right
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=64, write_statistics=["key_group"])
    old = buf.getvalue()
    f_old = TableFile("t.parquet", KeyGroupRange(2, 4), n, len(old), zlib.crc32(old))
    assert key_slices(old, f_old, 3) == []
    assert decode_key_range(old, f_old, 3, bounds[1], bounds[2]).equals(decode_key_range(data, f, 3, bounds[1], bounds[2]))


def _ranged_fixture(tmp_path: Path) -> tuple[Any, Any, pa.Table, bytes]:
    """A table file of key groups 0..7 (2,000 rows each, row groups of at most 1,000 rows,
    but key group 6: 5,000 rows; random values: some 300 KB, beyond the first read of 64 KiB)
    in a file store, with its manifest entry."""
    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.manifest import TableFile
    from statelog.materialization.table_schema import encode_parquet
    from statelog.store import open_store

    rng = random.Random(5)
    kgs = [g for g in range(8) for _ in range(5000 if g == 6 else 2000)]
    n = len(kgs)
    table = pa.table({
        "key_group": pa.array(kgs, pa.int32()),
        "key": pa.array([encode_key(i) for i in range(n)], pa.binary()),
        "namespace": pa.array([encode_key(None)] * n, pa.binary()),
        "value": pa.array([rng.getrandbits(63) for _ in range(n)], pa.int64()),
    })  # fmt: skip
    data = encode_parquet(table, row_group_rows=1000)
    assert len(data) > 2 * (64 << 10)
    store = open_store(tmp_path.as_uri())
    store.put("t.parquet", data)
    f = TableFile.of("t.parquet", KeyGroupRange(0, 7), n, data)
    return store, f, table, data


def test_a_table_file_read_in_ranges_reads_its_footer_and_the_row_groups_needed(tmp_path) -> None:
    """RangedTableFile: a key group's rows from the footer and its own row groups (each
    verified against the manifest's checksums), equal to a read of the whole file; the
    manifest entry keeps the checksums through JSON, and entries without them still read."""
    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.key_slices import decode_key_range, key_slices
    from statelog.materialization.manifest import TableFile
    from statelog.materialization.ranged import RangedTableFile
    from statelog.materialization.table_reader import decode_table_file

    store, f, table, data = _ranged_fixture(tmp_path)
    assert TableFile.from_json(json.loads(json.dumps(f.to_json()))) == f
    assert len(f.row_group_crc32) == 19 and f.footer[0] < 16_000
    old = {k: v for k, v in f.to_json().items() if k not in ("footer", "row_group_crc32")}
    assert TableFile.from_json(old).row_group_crc32 is None  # written before: read whole

    reads: list[int] = []
    ranged = RangedTableFile(store, f, reads.append)
    assert reads == [min(len(data), 64 << 10)]  # the footer (with what precedes it up to 64 KiB)
    got = decode_table_file(ranged, f, KeyGroupRange(3, 3))
    assert got.equals(decode_table_file(data, f, KeyGroupRange(3, 3)))
    assert got.column("value").to_pylist() == table.column("value").to_pylist()[6000:8000]
    assert len(reads) == 2  # its two row groups, adjacent: one read
    assert key_slices(ranged, f, 3) == key_slices(data, f, 3) and len(reads) == 2  # the footer only
    lo = key_slices(data, f, 5)[0]
    assert decode_key_range(ranged, f, 5, lo, None).equals(decode_key_range(data, f, 5, lo, None))
    # a middle slice, then the whole key group: Arrow reads its row groups in one read,
    # across the parts fetched apart
    lo, hi = key_slices(data, f, 6)[1:3]
    assert decode_key_range(ranged, f, 6, lo, hi).equals(decode_key_range(data, f, 6, lo, hi))
    assert decode_table_file(ranged, f, KeyGroupRange(6, 6)).equals(decode_table_file(data, f, KeyGroupRange(6, 6)))
    assert decode_table_file(ranged, f, KeyGroupRange(0, 7)).equals(table)  # the rest, once
    assert sum(reads) < 2 * len(data)


def test_a_table_file_read_in_ranges_fails_on_the_corrupt_part_it_reads_naming_the_file(tmp_path) -> None:
    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.ranged import RangedTableFile
    from statelog.materialization.table_reader import decode_table_file
    from statelog.materialization.table_schema import row_group_span

    store, f, _table, data = _ranged_fixture(tmp_path)
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    a, b = row_group_span(md, 9)  # key group 4's second row group
    bad = bytearray(data)
    bad[(a + b) // 2] ^= 0x01
    path = tmp_path / "t.parquet"
    path.write_bytes(bytes(bad))
    ranged = RangedTableFile(store, f)
    assert decode_table_file(ranged, f, KeyGroupRange(3, 3)).num_rows == 2000  # other row groups: read
    with pytest.raises(CorruptionError, match=r"state table t\.parquet: row group 9 does not match"):
        decode_table_file(ranged, f, KeyGroupRange(4, 4))
    for pos in (len(data) - 20, len(data) - 5):  # the footer, its length
        bad = bytearray(data)
        bad[pos] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(CorruptionError, match=r"state table t\.parquet: its footer does not match"):
            RangedTableFile(store, f)
    path.write_bytes(data[:-100])
    with pytest.raises(CorruptionError, match=r"t\.parquet"):
        RangedTableFile(store, f)
    path.unlink()
    with pytest.raises(CorruptionError, match=r"state table t\.parquet is missing"):
        RangedTableFile(store, f)


def test_a_table_file_read_in_ranges_decodes_from_several_threads_at_once(tmp_path) -> None:
    """Threads decoding key groups and key slices of one RangedTableFile at once (as an
    on-demand restore's pool does) each get the rows a read of the whole file gives; Arrow's
    read cache of one reader is not shared between them."""
    from concurrent.futures import ThreadPoolExecutor

    from statelog.keys.groups import KeyGroupRange
    from statelog.materialization.key_slices import decode_key_range, key_slices
    from statelog.materialization.ranged import RangedTableFile
    from statelog.materialization.table_reader import decode_table_file

    store, f, _table, data = _ranged_fixture(tmp_path)
    want = {g: decode_table_file(data, f, KeyGroupRange(g, g)) for g in range(8)}
    lo, hi = key_slices(data, f, 6)[1:3]
    want_slice = decode_key_range(data, f, 6, lo, hi)
    with ThreadPoolExecutor(4) as pool:
        for _ in range(20):
            ranged = RangedTableFile(store, f)
            jobs = [pool.submit(decode_table_file, ranged, f, KeyGroupRange(g, g)) for g in range(8)]
            jobs.append(pool.submit(decode_key_range, ranged, f, 6, lo, hi))
            assert [j.result() for j in jobs[:8]] == [want[g] for g in range(8)]
            assert jobs[8].result().equals(want_slice)
