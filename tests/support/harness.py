"""A reference model of keyed state and a driver applying the same operations to a backend.

The model is deliberately naive (plain dicts, no key groups, no changelog) so that it can
serve as the oracle for property, crash and rescale tests.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from statelog import (
    PICKLE,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    TtlConfig,
    ValueStateDescriptor,
)
from statelog.keys.encoding import encode_key
from statelog.state.batch import SUM

TTL_MS = 50


class AvgAgg:
    """Average as an aggregate function with a pickled (sum, count) accumulator."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1] if acc[1] else 0.0


def _add(a: int, b: int) -> int:
    return a + b


_add.batch_reduction = SUM  # type: ignore[attr-defined]  # add_many folds a batch with Arrow


DESCRIPTORS = {
    "value": ValueStateDescriptor("value", pa.int64()),
    "text": ValueStateDescriptor("text", pa.string()),
    "list": ListStateDescriptor("list", pa.string()),
    "map": MapStateDescriptor("map", pa.int64(), key_type=pa.string()),
    "sum": ReducingStateDescriptor("sum", pa.int64(), reduce_fn=_add),
    "avg": AggregatingStateDescriptor("avg", PICKLE, aggregate=AvgAgg()),
    "ttl": ValueStateDescriptor("ttl", pa.int64(), ttl=TtlConfig(TTL_MS)),
    "obj": ValueStateDescriptor("obj", PICKLE),
}


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass
class Model:
    """Plain-dict model: ``tables[state][(key, ns)]`` and timers ``{(domain, ts, key, ns)}``."""

    tables: dict[str, dict[tuple[Any, Any], Any]] = field(
        default_factory=lambda: {name: {} for name in DESCRIPTORS}
    )
    timers: set[tuple[str, int, Any, Any]] = field(default_factory=set)

    def copy(self) -> Model:
        return Model(copy.deepcopy(self.tables), set(self.timers))

    def visible(self, now: int) -> dict[str, dict[tuple[Any, Any], Any]]:
        out = {}
        for name, table in self.tables.items():
            if name == "ttl":
                out[name] = {k: v for k, (v, exp) in table.items() if exp > now}
            elif name == "avg":
                out[name] = dict(table)
            else:
                out[name] = {k: copy.deepcopy(v) for k, v in table.items()}
        return out


def backend_view(backend: Any, states: dict[str, Any]) -> dict[str, dict[tuple[Any, Any], Any]]:
    out = {}
    for name, st in states.items():
        out[name] = {(k, ns): v for k, ns, v in st.entries()}
    return out


def backend_timers(backend: Any) -> set[tuple[str, int, Any, Any]]:
    return {
        (t.domain, t.timestamp, t.key, t.namespace)
        for domain in ("event", "processing")
        for t in backend.timers.timers(domain)
    }


def register_all(backend: Any) -> dict[str, Any]:
    return {name: backend.get_state(d) for name, d in DESCRIPTORS.items()}


class Driver:
    """Applies one operation to a backend and to the model, asserting read results agree."""

    def __init__(self, backend: Any, model: Model, clock: Clock) -> None:
        self.backend = backend
        self.states = register_all(backend)
        self.model = model
        self.clock = clock
        self.key: Any = None
        self.key_set = False
        self.ns: Any = None

    def set_key(self, key: Any) -> None:
        self.key = key
        self.key_set = True
        self.backend.set_current_key(key)

    def set_ns(self, ns: Any) -> None:
        self.ns = ns
        for st in self.states.values():
            st.set_namespace(ns)

    def apply(self, op: tuple) -> None:  # noqa: C901 - one branch per operation
        kind = op[0]
        m = self.model.tables
        k = (self.key, self.ns)
        s = self.states
        if kind == "key":
            self.set_key(op[1])
        elif kind == "ns":
            self.set_ns(op[1])
        elif kind == "value_rmw":
            cur = s["value"].value()
            assert cur == m["value"].get(k), (cur, m["value"].get(k))
            new = (cur or 0) + op[1]
            s["value"].update(new)
            m["value"][k] = new
        elif kind == "value_clear":
            s["value"].clear()
            m["value"].pop(k, None)
        elif kind == "text":
            s["text"].update(op[1])
            m["text"][k] = op[1]
        elif kind == "list_add":
            s["list"].add(op[1])
            m["list"].setdefault(k, []).append(op[1])
        elif kind == "list_update":
            s["list"].update(op[1])
            if op[1]:
                m["list"][k] = list(op[1])
            else:
                m["list"].pop(k, None)
        elif kind == "list_get":
            assert s["list"].get() == m["list"].get(k, [])
        elif kind == "list_clear":
            s["list"].clear()
            m["list"].pop(k, None)
        elif kind == "map_put":
            s["map"].put(op[1], op[2])
            m["map"].setdefault(k, {})[op[1]] = op[2]
        elif kind == "map_remove":
            s["map"].remove(op[1])
            d = m["map"].get(k)
            if d is not None:
                d.pop(op[1], None)
                if not d:
                    del m["map"][k]
        elif kind == "map_get":
            assert s["map"].get(op[1]) == m["map"].get(k, {}).get(op[1])
        elif kind == "sum":
            s["sum"].add(op[1])
            m["sum"][k] = m["sum"].get(k, 0) + op[1]
        elif kind == "avg":
            s["avg"].add(op[1])
            a = m["avg"].get(k, (0, 0))
            m["avg"][k] = (a[0] + op[1], a[1] + 1)
        elif kind == "ttl_put":
            s["ttl"].update(op[1])
            m["ttl"][k] = (op[1], self.clock.now + TTL_MS)
        elif kind == "ttl_get":
            entry = m["ttl"].get(k)
            expect = entry[0] if entry is not None and entry[1] > self.clock.now else None
            assert s["ttl"].value() == expect
        elif kind == "obj":
            s["obj"].update(op[1])
            m["obj"][k] = op[1]
        elif kind == "tick":
            self.clock.now += op[1]
        elif kind == "timer_add":
            domain, ts = op[1], op[2]
            if domain == "event":
                self.backend.timers.register_event_time_timer(ts, self.ns)
            else:
                self.backend.timers.register_processing_time_timer(ts, self.ns)
            self.model.timers.add((domain, ts, self.key, self.ns))
        elif kind == "timer_del":
            domain, ts = op[1], op[2]
            if domain == "event":
                self.backend.timers.delete_event_time_timer(ts, self.ns)
            else:
                self.backend.timers.delete_processing_time_timer(ts, self.ns)
            self.model.timers.discard((domain, ts, self.key, self.ns))
        elif kind == "fire":
            wm = op[1]
            fired = [(t.domain, t.timestamp, t.key, t.namespace) for t in self.backend.timers.advance_watermark(wm)]
            due = sorted(
                (t for t in self.model.timers if t[0] == "event" and t[1] <= wm),
                key=lambda t: (t[1], encode_key(t[2]), encode_key(t[3])),
            )
            assert fired == due, (fired, due)
            self.model.timers -= set(due)
            if self.key_set:
                self.backend.set_current_key(self.key)
        elif kind.startswith("batch_"):
            self.apply_batch(op)
        else:
            raise AssertionError(f"unknown op {op!r}")

    def apply_batch(self, op: tuple) -> None:
        """A batch call (``tests/support/state_ops.py`` BATCH_OPS) on a column of keys, as an
        Arrow array when the keys make one, else a list; the model applies it key by key."""
        kind, pairs = op[0], op[1]
        keys = [k for k, _ in pairs]
        vals = [v for _, v in pairs]
        if op[2]:
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                keys = pa.array(keys)
        m = self.model.tables
        s = self.states
        ns = self.ns
        if kind == "batch_value_put":
            s["value"].put_many(keys, vals)
            for k, v in pairs:
                m["value"][(k, ns)] = v
        elif kind == "batch_value_get":
            got = s["value"].get_many(keys).to_pylist()
            assert got == [m["value"].get((k, ns)) for k, _ in pairs], got
        elif kind == "batch_value_delete":
            s["value"].delete_many(keys)
            for k, _ in pairs:
                m["value"].pop((k, ns), None)
        elif kind == "batch_text_put":
            s["text"].put_many(keys, [str(v) for v in vals])
            for k, v in pairs:
                m["text"][(k, ns)] = str(v)
        elif kind == "batch_sum":
            s["sum"].add_many(keys, vals)
            for k, v in pairs:
                m["sum"][(k, ns)] = m["sum"].get((k, ns), 0) + v
        elif kind == "batch_avg":
            s["avg"].add_many(keys, vals)
            for k, v in pairs:
                a = m["avg"].get((k, ns), (0, 0))
                m["avg"][(k, ns)] = (a[0] + v, a[1] + 1)
        elif kind == "batch_list_add":
            s["list"].add_many(keys, [str(v) for v in vals])
            for k, v in pairs:
                m["list"].setdefault((k, ns), []).append(str(v))
        elif kind == "batch_ttl_put":
            s["ttl"].put_many(keys, vals)
            for k, v in pairs:
                m["ttl"][(k, ns)] = (v, self.clock.now + TTL_MS)
        elif kind == "batch_ttl_get":
            got = s["ttl"].get_many(keys).to_pylist()
            now = self.clock.now
            want = []
            for k, _ in pairs:
                e = m["ttl"].get((k, ns))
                want.append(e[0] if e is not None and e[1] > now else None)
            assert got == want, (got, want)
        else:
            raise AssertionError(f"unknown op {op!r}")

    def check_equal(self) -> None:
        assert_state_equal(self.backend, self.states, self.model, self.clock.now)


def assert_state_equal(backend: Any, states: dict[str, Any], model: Model, now: int) -> None:
    got = backend_view(backend, states)
    want = model.visible(now)
    for name in DESCRIPTORS:
        assert got[name] == want[name], f"state {name!r} differs:\n got={got[name]}\nwant={want[name]}"
    got_timers = backend_timers(backend)
    assert got_timers == model.timers, (
        f"timers differ: only restored={got_timers - model.timers}, only model={model.timers - got_timers}"
    )
