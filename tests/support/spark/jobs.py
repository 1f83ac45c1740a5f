"""A job with every state kind for the Spark tests, and reference views from backend restores.

``build(root, options)`` writes operator ``op`` at parallelism 2 (max_parallelism 16) with
value, list, map, reducing, aggregating, pickled and TTL state, namespaces and event-time
timers, and takes four checkpoints:

* ``c1``: changelog only (no materialization yet); then ``c1`` is materialized (``m1``);
* ``c2``: no change since: builds on ``m1`` with an empty tail;
* ``c3``: more changes: ``m1`` plus a non-empty tail;
* ``c4``: more changes, deletes included: ``m1`` plus a longer tail.

It also writes operator ``words`` (parallelism 1, string keys only) for ``keyType`` tests.
``assert_same_tables`` compares two materializations of one checkpoint file by file.
"""

from __future__ import annotations

import copy
import pickle
import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

import statelog
from materializer.build import materialize
from statelog import (
    ValueStateDescriptor,
)
from statelog.keys.encoding import decode_key, encode_key
from statelog.materialization.manifest import Manifest
from statelog.materialization.table_reader import read_table_file
from statelog.readers.restore import FAR_PAST_MS
from statelog.store.base import ObjectStore
from tests.support.harness import Clock
from tests.support.state_kinds import every_state_kind

MAXP = 16
TTL_MS = 60_000
DESCRIPTORS = every_state_kind(TTL_MS)  # tests/support/state_kinds.py
STATES = [d.name for d in DESCRIPTORS] + ["__timers_event"]
KEYS = [*(f"user-{i}" for i in range(40)), *range(20), ("t", 1), ("t", 2), None]
NAMESPACES = [None, None, (0, 1000), (1000, 2000)]


@dataclass
class Built:
    root: str
    options: dict[str, Any] = field(repr=False)  # may hold the S3 secret
    c1: int = 0
    c2: int = 0
    c3: int = 0
    c4: int = 0
    m1: str = ""
    # expected TTL expiry per checkpoint and (state, key bytes): value -> int, list -> [int], map -> {k: int}
    expiry: dict[int, dict[tuple[str, bytes], Any]] = field(default_factory=dict, repr=False)


def _ops(rng: random.Random, backends: dict[int, Any], states: dict[int, dict[str, Any]], clock: Clock,
         n: int, deletes: bool, ttl: dict[tuple[str, bytes], Any]) -> None:
    """Random operations; ``ttl`` tracks the expected expiry of the TTL states' entries."""
    for i in range(n):
        key = rng.choice(KEYS)
        kg = statelog.key_group_of(key, MAXP)
        sub = statelog.subtask_for_key_group(MAXP, 2, kg)
        b, st = backends[sub], states[sub]
        b.set_current_key(key)
        clock.now += rng.randrange(1, 50)
        what = rng.randrange(12)
        ns = rng.choice(NAMESPACES)
        if what == 0:
            s = st["count"]
            s.set_namespace(ns)
            s.update(s.value() + 1)
        elif what == 1:
            s = st["seen"]
            s.set_namespace(ns)
            s.add(f"e{i}")
        elif what == 2:
            st["attrs"].put(rng.choice("pqr"), i)
        elif what == 3:
            st["total"].add(i % 7)
        elif what == 4:
            st["avg"].add(i % 5)
        elif what == 5:
            st["blob"].update({"n": i, "tags": {"a", "b"}, "t": (i, "x")})
        elif what == 6:
            st["ttl_v"].update(i)
            ttl[("ttl_v", encode_key(key))] = clock.now + TTL_MS
        elif what == 7:
            st["ttl_l"].add(i)
            ttl.setdefault(("ttl_l", encode_key(key)), []).append(clock.now + TTL_MS)
        elif what == 8:
            mk = rng.choice("xy")
            st["ttl_m"].put(mk, {"i": i})
            ttl.setdefault(("ttl_m", encode_key(key)), {})[mk] = clock.now + TTL_MS
        elif what == 9:
            st["pmap"].put(rng.choice([("k", 1), 7, "s"]), f"v{i}")
        elif what == 10:
            b.timers.register_event_time_timer(rng.randrange(10_000), ns)
        elif deletes:
            victim = rng.choice([st["count"], st["seen"], st["attrs"], st["ttl_l"], st["pmap"]])
            victim.clear()
            if victim is st["ttl_l"]:
                ttl.pop(("ttl_l", encode_key(key)), None)
            if rng.random() < 0.3:
                st["attrs"].remove("p")
            if rng.random() < 0.3:
                b.timers.delete_event_time_timer(rng.randrange(10_000))
        else:
            st["seen"].update([f"r{i}", f"s{i}"])


def build(root: str, options: dict[str, Any], seed: int = 7, ops: int = 300) -> Built:
    rng = random.Random(seed)
    clock = Clock(1_000_000)
    out = Built(root, dict(options))
    job = statelog.open(root, store_options=options or None, max_parallelism=MAXP)
    job.materialization_poll_s = 0
    try:
        backends = {i: job.backend("op", subtask=i, parallelism=2, clock=clock) for i in range(2)}
        states = {i: {d.name: backends[i].get_state(d) for d in DESCRIPTORS} for i in range(2)}
        words = job.backend("words", clock=clock)
        wcount = words.get_state(ValueStateDescriptor("n", pa.int64()))
        for i in range(30):
            words.set_current_key(f"w{i % 12}")
            wcount.update(i)
        ttl: dict[tuple[str, bytes], Any] = {}
        _ops(rng, backends, states, clock, ops, False, ttl)
        meta1 = job.checkpoint(sources={"offset": 1})
        out.c1 = meta1.checkpoint_id
        out.expiry[out.c1] = copy.deepcopy(ttl)
        out.m1 = materialize(job.store, meta1).key
        out.c2 = job.checkpoint(sources={"offset": 1}).checkpoint_id
        out.expiry[out.c2] = copy.deepcopy(ttl)
        _ops(rng, backends, states, clock, ops // 2, True, ttl)
        out.c3 = job.checkpoint(sources={"offset": 2}).checkpoint_id
        out.expiry[out.c3] = copy.deepcopy(ttl)
        _ops(rng, backends, states, clock, ops // 2, True, ttl)
        words.set_current_key("w0")
        wcount.update(999)
        out.c4 = job.checkpoint(sources={"offset": 3}).checkpoint_id
        out.expiry[out.c4] = copy.deepcopy(ttl)
    finally:
        job.close()
    return out


# -- references ----------------------------------------------------------------------------------


def descriptor(name: str) -> Any:
    return next(d for d in DESCRIPTORS if d.name == name)


def norm(v: Any) -> Any:
    """Comparable form of values (lists as tuples, dicts and sets as sorted tuples)."""
    if hasattr(v, "asDict"):  # a Spark Row (struct)
        return norm(v.asDict())
    if isinstance(v, dict):
        return tuple(sorted(((norm(k), norm(x)) for k, x in v.items()), key=repr))
    if isinstance(v, list | tuple):
        return tuple(norm(x) for x in v)
    if isinstance(v, set | frozenset):
        return tuple(sorted((norm(x) for x in v), key=repr))
    return v


def restored_rows(job: statelog.StateJob, checkpoint: Any, state: str, parallelism: int = 1,
                  uid: str = "op") -> set[tuple]:
    """``(key bytes, namespace bytes, normalized value)`` of a backend restore (every entry visible)."""
    rows = set()
    for i in range(parallelism):
        b = job.backend(uid, subtask=i, parallelism=parallelism, restore=checkpoint, changelog=False,
                        clock=lambda: FAR_PAST_MS)
        if state.startswith("__timers"):
            for t in b.timers.timers("event"):
                rows.add((encode_key(t.key), encode_key(t.namespace), t.timestamp))
        else:
            b.get_state(descriptor(state))
            for key, ns, value in b.entries(state):
                rows.add((encode_key(key), encode_key(ns), norm(value)))
        b.close()
    return rows


def row_triple(r: Any, state: str) -> tuple:
    """``(key bytes, namespace bytes, normalized value)`` of one row of ``format("statelog")``."""
    if state.startswith("__timers"):
        value: Any = r["timestamp"]
    elif "value_pickle" in r.asDict():
        value = norm(pickle.loads(r["value_pickle"]))
    else:
        value = norm(r["value"])
    return bytes(r["key_bytes"]), bytes(r["namespace_bytes"]), value


def spark_rows(df: Any, state: str) -> set[tuple]:
    """The triples of :func:`restored_rows` from the rows of ``format("statelog")``."""
    return {row_triple(r, state) for r in df.collect()}


def decode_row_key(r: Any) -> tuple[Any, Any]:
    return decode_key(bytes(r["key_bytes"])), decode_key(bytes(r["namespace_bytes"]))


def assert_same_tables(store: ObjectStore, a: Manifest, b: Manifest) -> int:
    """``a`` and ``b`` hold the same tables file by file (rows compared); returns the files compared."""
    assert sorted(a.operators) == sorted(b.operators)
    compared = 0
    for uid, opa in a.operators.items():
        opb = b.operators[uid]
        assert opa.states == opb.states and opa.covered == opb.covered, uid
        assert sorted(opa.files) == sorted(opb.files), uid
        infos = {i.name: i for i in opa.states}
        for name, fa in opa.files.items():
            fb = opb.files[name]
            assert [(f.key_groups, f.rows) for f in fa] == [(f.key_groups, f.rows) for f in fb], (uid, name)
            for x, y in zip(fa, fb, strict=True):
                new_a, new_b = f"/{a.mid}/" in x.path, f"/{b.mid}/" in y.path
                assert new_a == new_b and (new_a or x.path == y.path), (x.path, y.path)  # reused alike
                ta = read_table_file(store, x, x.key_groups, infos[name])
                tb = read_table_file(store, y, y.key_groups, infos[name])
                assert ta.to_pylist() == tb.to_pylist(), (uid, name, x.path, y.path)
                compared += 1
    assert a.rows == b.rows and a.checkpoint_id == b.checkpoint_id
    return compared
