"""The deterministic operation stream of the crash test, shared by the worker and the test.

``op(seed, i)`` is the i-th operation of an infinite stream; it depends only on ``(seed, i)``
and is self-contained: ``(key, namespace, action)``, where ``action`` is an operation tuple of
:class:`tests.support.harness.Driver` (plus ``fire_proc``). A restarted worker therefore resumes
at any offset without any context from the operations before it.

Time is logical: operation i runs with clock ``i`` (TTL and timer timestamps are in ops), so
the state after ops ``[0, n)`` is a pure function of ``(seed, n)``: :func:`model_at` computes
it with the reference model alone, without any backend.

The checkpoint schedule is deterministic too (:func:`checkpoint_plan`): after a checkpoint at
position p, the next one is sealed at ``p + K`` with K in 50..400, as a one-call checkpoint or
(half of them) as a two-phase one: the sync part at the seal, the publish 1..300 ops later,
with the position at the seal as offset, so records after the seal share segments with it.
"""

from __future__ import annotations

import bisect
import copy
import pickle
import random
from typing import Any

from statelog.keys.encoding import decode_key, encode_key
from tests.support.harness import TTL_MS, Driver, Model, backend_timers, register_all

OPERATOR_UID = "crash-op"


def _build_keys() -> list[Any]:
    keys: list[Any] = []
    keys += list(range(-20, 80))  # int64
    keys += [2**40 + i for i in range(8)] + [2**70 + i for i in range(4)] + [-(2**66)]
    keys += [f"user-{i}" for i in range(60)]
    keys += [f"ключ-{i}-ü" for i in range(12)]
    keys += [(i, "x") for i in range(25)]
    keys += [(i, (i % 3, "y"), b"z") for i in range(10)]
    keys += [b"k\x00" + bytes([i]) for i in range(25)]
    keys += [i + 0.5 for i in range(10)] + [-1e300]
    keys += [None, "", b"", ()]
    # no bools and no integral floats: they compare equal to ints in Python (see statelog.keys.encoding)
    return keys


KEYS: list[Any] = _build_keys()
NAMESPACES: list[Any] = [None, None, (0, 10), (10, 20), (20, 30), "w", 7]
MAP_KEYS = ["p", "q", "r", "s", "ß"]
TEXTS = ["", "a", "bb", "ccc", "héllo", "日本", "x" * 40]

# (action, weight)
_ACTIONS: list[tuple[str, float]] = [
    ("value_rmw", 12),
    ("value_clear", 2),
    ("text", 5),
    ("list_add", 8),
    ("list_update", 3),
    ("list_get", 3),
    ("list_clear", 2),
    ("map_put", 8),
    ("map_remove", 4),
    ("map_get", 3),
    ("sum", 6),
    ("avg", 5),
    ("ttl_put", 6),
    ("ttl_get", 4),
    ("obj", 4),
    ("timer_add", 7),
    ("timer_del", 4),
    ("fire", 1.5),
    ("fire_proc", 1),
]
_NAMES = [a for a, _ in _ACTIONS]
_CUM: list[float] = []
_total = 0.0
for _a, _w in _ACTIONS:
    _total += _w
    _CUM.append(_total)


def _rng(seed: int, i: int) -> random.Random:
    return random.Random(seed * 1_000_003 + i)


def _timer_ts(rng: random.Random, i: int) -> int:
    # multiples of 25 ahead of i, so timer_del often hits a registered timer
    return (i // 25 + rng.randint(1, 12)) * 25


def op(seed: int, i: int) -> tuple[Any, Any, tuple]:
    """Operation i of the stream of ``seed``: ``(key, namespace, action)``."""
    rng = _rng(seed, i)
    key = KEYS[rng.randrange(len(KEYS))]
    ns = NAMESPACES[rng.randrange(len(NAMESPACES))]
    kind = _NAMES[bisect.bisect_right(_CUM, rng.random() * _total)]
    small = rng.randint(-5, 100)
    action: tuple
    if kind in ("value_rmw", "sum", "avg", "ttl_put"):
        action = (kind, small)
    elif kind in ("text", "list_add"):
        action = (kind, rng.choice(TEXTS))
    elif kind == "list_update":
        action = (kind, [rng.choice(TEXTS) for _ in range(rng.randint(0, 3))])
    elif kind in ("map_put",):
        action = (kind, rng.choice(MAP_KEYS), small)
    elif kind in ("map_remove", "map_get"):
        action = (kind, rng.choice(MAP_KEYS))
    elif kind == "obj":
        action = (
            kind,
            {
                rng.choice("xyz"): [rng.randint(-5, 100) for _ in range(rng.randint(0, 2))]
                for _ in range(rng.randint(0, 2))
            },
        )
    elif kind in ("timer_add", "timer_del"):
        action = (kind, rng.choice(("event", "processing")), _timer_ts(rng, i))
    elif kind in ("fire", "fire_proc"):
        action = (kind, i)
    else:
        action = (kind,)
    return key, ns, action


def checkpoint_plan(seed: int, position: int) -> tuple[int, int]:
    """After a checkpoint sealed at ``position``: ``(next seal position, two-phase delay)``.

    A delay of 0 means a one-call checkpoint; otherwise the sync part runs at the seal and the
    checkpoint is published ``delay`` operations later (with the seal position as offset).
    """
    rng = random.Random(seed * 7_919 + position * 31 + 5)
    gap = rng.randint(50, 400)
    delay = rng.randint(1, 300) if rng.random() < 0.5 else 0
    return position + gap, delay


def apply_model(model: Model, key: Any, ns: Any, action: tuple, now: int) -> None:
    """Apply one operation to the reference model alone (clock = ``now``)."""
    kind = action[0]
    m = model.tables
    k = (key, ns)
    if kind == "value_rmw":
        m["value"][k] = (m["value"].get(k) or 0) + action[1]
    elif kind in ("value_clear", "list_clear"):
        m["value" if kind == "value_clear" else "list"].pop(k, None)
    elif kind in ("text", "obj"):
        m[kind][k] = action[1]
    elif kind == "list_add":
        m["list"].setdefault(k, []).append(action[1])
    elif kind == "list_update":
        if action[1]:
            m["list"][k] = list(action[1])
        else:
            m["list"].pop(k, None)
    elif kind == "map_put":
        m["map"].setdefault(k, {})[action[1]] = action[2]
    elif kind == "map_remove":
        d = m["map"].get(k)
        if d is not None:
            d.pop(action[1], None)
            if not d:
                del m["map"][k]
    elif kind == "sum":
        m["sum"][k] = m["sum"].get(k, 0) + action[1]
    elif kind == "avg":
        s, c = m["avg"].get(k, (0, 0))
        m["avg"][k] = (s + action[1], c + 1)
    elif kind == "ttl_put":
        m["ttl"][k] = (action[1], now + TTL_MS)
    elif kind == "timer_add":
        model.timers.add((action[1], action[2], key, ns))
    elif kind == "timer_del":
        model.timers.discard((action[1], action[2], key, ns))
    elif kind in ("fire", "fire_proc"):
        domain = "event" if kind == "fire" else "processing"
        model.timers -= {t for t in model.timers if t[0] == domain and t[1] <= action[1]}
    elif kind in ("list_get", "map_get", "ttl_get"):
        pass  # reads change nothing the model keeps (expired TTL entries stay invisible)
    else:
        raise AssertionError(f"unknown action {action!r}")


def copy_model(model: Model) -> Model:
    """A deep copy of ``model`` (a pickle round trip: several times faster than deepcopy)."""
    return Model(pickle.loads(pickle.dumps(model.tables, protocol=5)), set(model.timers))


class ModelReplay:
    """The model after ops ``[0, n)`` for any n, replaying from the nearest cached position."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._cache: dict[int, Model] = {0: Model()}

    def model_at(self, n: int) -> Model:
        start = max(p for p in self._cache if p <= n)
        model = copy_model(self._cache[start])
        for i in range(start, n):
            key, ns, action = op(self.seed, i)
            apply_model(model, key, ns, action, i)
        if n not in self._cache:
            self._cache[n] = copy_model(model)
        return model


def model_at(seed: int, n: int) -> Model:
    """The model after ops ``[0, n)`` of the stream of ``seed``."""
    return ModelReplay(seed).model_at(n)


def model_from_backend(backend: Any) -> Model:
    """A model holding a copy of the state of ``backend`` (TTL entries with their expiry).

    Reads the states' in-memory tables directly, because the public iteration hides expired
    TTL entries and expiry times.
    """
    model = Model()
    states = register_all(backend)
    ws = backend._ws  # the disk-backed working set: its dicts hold only resident keys
    if ws is not None:
        ws.flush()
    for name, st in states.items():
        table = model.tables[name]
        if ws is not None:
            stored = ((decode_key(kb), decode_key(nsb), entry) for kb, nsb, entry in ws.scan(name))
        else:
            stored = (
                (key, st._namespaces[nsb], entry) for nsb, entries in st._tables.items() for key, entry in entries.items()
            )
        for key, ns, entry in stored:
            table[(key, ns)] = copy.deepcopy(tuple(entry) if name == "ttl" else entry)
    model.timers = backend_timers(backend)
    return model


class CrashDriver(Driver):
    """The harness driver plus ``fire_proc`` (processing-time timers firing at ``now``)."""

    def apply(self, action: tuple) -> None:
        if action[0] != "fire_proc":
            super().apply(action)
            return
        now = action[1]
        fired = [
            (t.domain, t.timestamp, t.key, t.namespace)
            for t in self.backend.timers.advance_processing_time(now)
        ]
        due = sorted(
            (t for t in self.model.timers if t[0] == "processing" and t[1] <= now),
            key=lambda t: (t[1], encode_key(t[2]), encode_key(t[3])),
        )
        assert fired == due, (fired, due)
        self.model.timers -= set(due)
        if self.key is not None:
            self.backend.set_current_key(self.key)

    def step(self, seed: int, i: int) -> None:
        """Run operation i at logical time i."""
        key, ns, action = op(seed, i)
        self.clock.now = i
        self.set_key(key)
        self.set_ns(ns)
        self.apply(action)
