"""The property tests' random operations on every state kind and their restore modes
(``tests/e2e/test_property.py``, ``tests/e2e/test_property_materialized.py``,
``tests/materializer/test_spark_materialize.py``); :class:`tests.support.harness.Driver`
applies them."""

from __future__ import annotations

from hypothesis import strategies as st

# keys equal in Python are one key: the model is a dict, so Python
# equality is the model; each group of colliding keys has members of different types
COLLIDING_KEYS = [True, False, 1.0, -0.0, 0.0, 7.0, (True, "x"), (1.0, "x"), ((1, (True,)), "n"),
                  ((1.0, (1,)), "n"), 2**80, float(2**80), -2.5]
KEYS = st.sampled_from([0, 1, 2, 7, -3, "a", "b", "user-9", (1, "x"), b"\x00k", 2.5, None, *COLLIDING_KEYS])
NAMESPACES = st.sampled_from([None, (0, 10), (10, 20), "w", (0.0, 10), (False, 10.0), (-0.0, 10), (10.0, 20.0)])
SMALL = st.integers(-5, 100)
TEXT = st.text(max_size=6)

# operations on state and timers
# a small pool of colliding keys, drawn as often as KEYS: its members meet each other often
TWINS = st.sampled_from([1, True, 1.0, 0, False, -0.0, (1, "x"), (True, "x"), (1.0, "x")])
STATE_OPS = st.one_of(
    st.tuples(st.just("key"), KEYS),
    st.tuples(st.just("key"), TWINS),
    st.tuples(st.just("ns"), NAMESPACES),
    st.tuples(st.just("value_rmw"), SMALL),
    st.tuples(st.just("value_clear")),
    st.tuples(st.just("text"), TEXT),
    st.tuples(st.just("list_add"), TEXT),
    st.tuples(st.just("list_update"), st.lists(TEXT, max_size=3)),
    st.tuples(st.just("list_get")),
    st.tuples(st.just("list_clear")),
    st.tuples(st.just("map_put"), st.sampled_from(["p", "q", "r"]), SMALL),
    st.tuples(st.just("map_remove"), st.sampled_from(["p", "q", "r"])),
    st.tuples(st.just("map_get"), st.sampled_from(["p", "q", "r"])),
    st.tuples(st.just("sum"), SMALL),
    st.tuples(st.just("avg"), SMALL),
    st.tuples(st.just("ttl_put"), SMALL),
    st.tuples(st.just("ttl_get")),
    st.tuples(st.just("obj"), st.dictionaries(st.sampled_from("xyz"), st.lists(SMALL, max_size=2), max_size=2)),
    st.tuples(st.just("tick"), st.integers(1, 40)),
    st.tuples(st.just("timer_add"), st.sampled_from(["event", "processing"]), st.integers(0, 200)),
    st.tuples(st.just("timer_del"), st.sampled_from(["event", "processing"]), st.integers(0, 200)),
    st.tuples(st.just("fire"), st.integers(0, 200)),
)


# batch calls: (kind, [(key, value), ...], keys as an Arrow array when they make one)
_PAIRS = st.lists(st.tuples(st.one_of(KEYS, TWINS, st.integers(0, 12)), SMALL), max_size=8)
BATCH_OPS = st.one_of(
    *(st.tuples(st.just(kind), _PAIRS, st.booleans()) for kind in (
        "batch_value_put", "batch_value_get", "batch_value_delete", "batch_text_put", "batch_sum",
        "batch_avg", "batch_list_add", "batch_ttl_put", "batch_ttl_get"))
)


# restore modes: ``eager`` (restore everything first), ``on-demand`` (key groups load when
# touched, plus the background loader), ``touched`` (only when touched: no background loader,
# so checkpoints and crashes happen with key groups not loaded yet); ``disk`` and
# ``disk-touched``: the same with the disk-backed working set, its cache 6 entries (every few
# operations write entries back and read them again)
MODES = ["eager", "touched", "on-demand", "disk", "disk-touched"]
DISK_CACHE_ENTRIES = 6


def is_lazy(mode: str) -> bool:
    return mode in ("touched", "on-demand", "disk-touched")
