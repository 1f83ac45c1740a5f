"""IntTable (statelog/_ext/inttable.c): the in-memory table of int keys behaves as a dict for
every key and operation, including the switch to dict mode, and its batch fold and bulk load
are all or nothing as fastpath's dict versions are."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from statelog import _ext

inttable = _ext.load("inttable")
pytestmark = pytest.mark.skipif(inttable is None, reason="the C extension is not built")

KEYS = [0, 1, -1, 2, 7, 8, 15, 16, 1 << 20, 2**63 - 1, -(2**63), 123456789]
OTHER = [2**63, -(2**63) - 1, 1.0, 2.5, True, False, "a", b"b", None, (1, 2)]
# values around the limit of ints kept inline (62 bits), and beyond int64
BIG = [2**62 - 1, 2**62, -(2**62), -(2**62) - 1, 2**63 - 1, -(2**63), 2**64, -(2**70), 1.5, True]


def _is(a, b):
    """``a is b``, but equal ints count as the same: an IntTable keeps ints within 62 bits as
    numbers, not objects, and makes a new int object for each read."""
    return a is b or (type(a) is int and type(b) is int and a == b)


def _same(t, d):
    assert len(t) == len(d)
    assert bool(t) == bool(d)
    assert dict(t.items()) == d
    assert sorted(map(repr, t)) == sorted(map(repr, d))
    assert sorted(map(repr, t.values())) == sorted(map(repr, d.values()))
    assert t == d
    assert (t != d) is False
    for k in d:
        assert k in t and _is(t[k], d[k]) and _is(t.get(k), d[k])


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_equal_a_dict(seed):
    rng = random.Random(seed)
    pool = [rng.randrange(-(2**63), 2**63) for _ in range(40)] + KEYS + list(range(200))
    if seed % 3 == 0:
        pool += OTHER  # some runs switch to dict mode part way
    t, d = inttable.IntTable(), {}
    other = False  # whether any operation got a key that is not an int64 (dict mode from then)

    def is_other(key):
        return type(key) is not int or not -(2**63) <= key < 2**63

    for step in range(3000):
        k = rng.choice(pool)
        op = rng.randrange(9)
        other = other or (op < 8 and is_other(k))
        r = rng.random()  # objects, small ints, and ints on both sides of the inline limit (2^62)
        v = object() if r < 0.3 else rng.choice(BIG) if r < 0.45 else rng.randrange(1000)
        if op <= 2:
            t[k] = v
            d[k] = v
        elif op == 3:
            assert _is(t.get(k, "no"), d.get(k, "no"))
        elif op == 4:
            assert (k in t) == (k in d)
        elif op == 5:
            assert _is(t.pop(k, "gone"), d.pop(k, "gone"))
        elif op == 6:
            if k in d:
                del t[k]
                del d[k]
            else:
                with pytest.raises(KeyError):
                    del t[k]
        elif op == 7:
            assert _is(t.setdefault(k, v), d.setdefault(k, v))
        else:
            pairs = [(rng.choice(pool), rng.randrange(9)) for _ in range(rng.randrange(5))]
            other = other or any(is_other(p[0]) for p in pairs)
            t.update(pairs)
            d.update(pairs)
        if step % 500 == 0:
            _same(t, d)
    _same(t, d)
    assert (t.dict() is not None) == other


def test_dict_semantics_for_equal_keys_of_other_types():
    t = inttable.IntTable({1: "one", 2: "two"})
    assert t.dict() is None
    assert t[1.0] == "one" and t[True] == "one"  # as in a dict: 1 == 1.0 == True
    assert t.dict() is not None  # the first other key moved the entries into a dict
    t["a"] = 3
    assert t == {1: "one", 2: "two", "a": 3}
    t.clear()
    assert t.dict() is None and len(t) == 0 and not t
    t[5] = 1
    assert t == {5: 1}


def test_missing_keys_raise_key_error_as_a_dict():
    t = inttable.IntTable()
    with pytest.raises(KeyError) as e:
        t[3]
    assert e.value.args == (3,)
    with pytest.raises(KeyError):
        t.pop(3)
    with pytest.raises(TypeError):
        t[[1]] = 2  # unhashable: the dict's error


def test_growth_deletion_and_iteration():
    t = inttable.IntTable()
    n = 100_000
    for k in range(n):
        t[k * 7919] = k
    for k in range(0, n, 2):
        del t[k * 7919]
    assert len(t) == n // 2
    assert sorted(t.keys()) == [k * 7919 for k in range(1, n, 2)]
    for k in range(n, n + 1000):
        t[k] = k
    assert t[1001 * 7919] == 1001 and 1000 * 7919 not in t
    with pytest.raises(RuntimeError):
        for k in t:
            t[-k - 10**12] = 0  # a new key while iterating: as a dict
    it = iter(t.items())
    first = next(it)
    t[first[0]] = "replaced"  # a value may change, as in a dict
    assert sum(1 for _ in it) == len(t) - 1


def test_copying_one_table_into_another_keeps_probes_short():
    # each table hashes with its own seed: inserting one table's keys in its iteration order
    # into a growing table (without the seed, every key piled onto the first slots) keeps
    # every key near its first slot, as for keys in random order
    src = inttable.IntTable()
    src.update((k, k) for k in range(200_000))
    assert src._longest_probe() < 100
    for dst in (inttable.IntTable(), inttable.IntTable()):
        longest = 0
        for i, (k, v) in enumerate(src.items()):
            dst[k] = v
            if i % 5_000 == 0:  # (part way: the whole table spreads out again at its last growth)
                longest = max(longest, dst._longest_probe())
        assert longest < 100
        assert dst == src
    assert src.copy()._longest_probe() == src._longest_probe()


def test_copy_pickle_repr_and_sizeof():
    t = inttable.IntTable([(1, [1]), (2, "x")])
    c = t.copy()
    assert c == t and c is not t and _is(c[1], t[1])
    assert pickle.loads(pickle.dumps(t)) == {1: [1], 2: "x"}
    assert repr(t) in ("IntTable({1: [1], 2: 'x'})", "IntTable({2: 'x', 1: [1]})")
    assert t.__sizeof__() > 0


def _fold(keys, partial, op, lo=-(2**63), hi=2**63 - 1, table=None):
    t = table if table is not None else inttable.IntTable()
    out = np.empty(len(keys), np.int64)
    ok = inttable.add_into(t, np.asarray(keys, np.int64), np.asarray(partial, np.int64), out, op, lo, hi)
    return t, ok, out


def test_add_into_folds_as_the_dict_reference():
    rng = np.random.default_rng(5)
    t, d = inttable.IntTable(), {}
    for _ in range(20):
        keys = np.unique(rng.integers(-50_000, 50_000, 20_000))
        rng.shuffle(keys)
        partial = rng.integers(-1000, 1000, len(keys))
        for op, f in ((inttable.FOLD_SUM, lambda a, b: a + b), (inttable.FOLD_MIN, min), (inttable.FOLD_MAX, max)):
            _, ok, out = _fold(keys, partial, op, table=t)
            assert ok is True
            for k, p, o in zip(keys.tolist(), partial.tolist(), out.tolist(), strict=True):
                d[k] = p if k not in d else f(d[k], p)
                assert o == d[k]
    assert t == d


def test_add_into_is_all_or_nothing():
    t = inttable.IntTable({1: 10, 2: "not an int", 3: 2**62})
    before = dict(t.items())
    _, ok, _ = _fold([5, 1, 2], [1, 1, 1], inttable.FOLD_SUM, table=t)  # a stored str
    assert ok is False and t == before
    _, ok, _ = _fold([6, 1, 3], [1, 1, 2**62], inttable.FOLD_SUM, table=t)  # int64 overflow
    assert ok is False and t == before
    _, ok, _ = _fold([7, 1], [1, 200], inttable.FOLD_SUM, lo=-128, hi=127, table=t)  # outside int8
    assert ok is False and t == before and 7 not in t
    _, ok, out = _fold([7, 1], [1, 5], inttable.FOLD_SUM, table=t)
    assert ok is True and out.tolist() == [1, 15] and t[7] == 1 and t[1] == 15
    t["k"] = 0  # dict mode: the caller folds through the dict
    _, ok, _ = _fold([7], [1], inttable.FOLD_SUM, table=t)
    assert ok is None and t[7] == 1


def test_put_items_loads_in_order_and_declines_other_keys():
    t = inttable.IntTable({4: "old"})
    keys, values = [1, 2, 4, 1], ["a", "b", "c", "d"]
    assert inttable.put_items(t, keys, values, 0, 4) is True
    assert t == {1: "d", 2: "b", 4: "c"}
    assert inttable.put_items(t, [9, "s"], [1, 2], 0, 2) is None and 9 not in t  # nothing done
    with pytest.raises(ValueError):
        inttable.put_items(t, [1], [], 0, 1)


def test_reserve_makes_room_without_a_resize():
    t = inttable.IntTable()
    t.reserve(10_000)
    size = t.__sizeof__()
    for k in range(10_000):
        t[k * 31] = k
    assert t.__sizeof__() == size and len(t) == 10_000
    t[-1] = 0  # one more than reserved may grow it, and everything stays
    assert all(t[k * 31] == k for k in range(10_000))
    with pytest.raises(ValueError):
        t.reserve(-1)
    t["s"] = 1
    t.reserve(10**6)  # dict mode: nothing to reserve
    assert t["s"] == 1 and len(t) == 10_002


def test_put_arrays_takes_int64_arrays_and_lists_of_values():
    t = inttable.IntTable({4: "old", 7: "kept"})
    keys = np.array([1, 2, 4, 1, 2**63 - 1, -(2**63)], np.int64)
    assert inttable.put_arrays(t, keys, np.array([10, 20, 30, 40, -5, 2**63 - 1], np.int64), 0, 6) is True
    assert t == {1: 40, 2: 20, 4: 30, 7: "kept", 2**63 - 1: -5, -(2**63): 2**63 - 1}
    assert all(type(v) is int for k, v in t.items() if k != 7)
    assert inttable.put_arrays(t, keys, ["a", "b", "c", "d", "e", "f"], 2, 4) is True  # a range, boxed values
    assert t[4] == "c" and t[1] == "d" and t[2] == 20
    with pytest.raises(TypeError):
        inttable.put_arrays(t, np.array([1.0]), [1], 0, 1)  # keys must be int64s
    with pytest.raises(TypeError):
        inttable.put_arrays(t, keys, np.array([1], np.int64), 0, 1)  # as many values as keys
    with pytest.raises(ValueError):
        inttable.put_arrays(t, keys, [1] * 6, 3, 9)
    t["s"] = 1  # dict mode: declined, nothing done
    assert inttable.put_arrays(t, keys, [0] * 6, 0, 6) is None and t[1] == "d"


def test_large_tables_in_their_own_mapping_behave_the_same():
    # tables of 4 MiB of slots and more are mappings of their own (huge pages where offered)
    n = 400_000
    keys = np.random.default_rng(3).permutation(10 * n)[:n].astype(np.int64)
    t = inttable.IntTable()
    t.reserve(n)
    assert t.__sizeof__() >= 4 << 20
    assert inttable.put_arrays(t, keys, keys * 2, 0, n) is True
    c = t.copy()
    assert len(c) == n and all(c[int(k)] == 2 * int(k) for k in keys[:: n // 1000])
    assert t._longest_probe() < 64
    for k in keys[: n // 2].tolist():
        del t[k]
    assert len(t) == n // 2 and c == {int(k): 2 * int(k) for k in keys}
    t.clear()
    assert len(t) == 0 and t.__sizeof__() < 1 << 20
    t.update({1: 2})
    c["x"] = 1  # to dict mode from a large mapping
    assert len(c) == n + 1 and t == {1: 2}


def test_ints_inline_and_as_objects_read_back_equal_and_fold_across_the_limit():
    t = inttable.IntTable()
    for k, v in enumerate(BIG):
        t[k] = v
    assert [t[k] for k in range(len(BIG))] == BIG
    assert [type(t[k]) for k in range(len(BIG))] == [type(v) for v in BIG]  # True stays a bool
    assert sorted(map(repr, t.values())) == sorted(map(repr, BIG))
    # sums that cross 2^62 (inline -> object) and come back, and new keys past it
    _, ok, out = _fold([0, 2, 100], [1, -1, 2**62 + 5], inttable.FOLD_SUM, table=t)
    assert ok is True and out.tolist() == [2**62, -(2**62) - 1, 2**62 + 5]
    assert t[0] == 2**62 and t[2] == -(2**62) - 1 and t[100] == 2**62 + 5
    _, ok, out = _fold([0, 100], [-1, -(2**62)], inttable.FOLD_SUM, table=t)
    assert ok is True and t[0] == 2**62 - 1 and t[100] == 5
    c = t.copy()
    del t[0]
    assert c[0] == 2**62 - 1 and t.pop(1) == 2**62 and t.pop(100) == 5
    assert pickle.loads(pickle.dumps(c)) == dict(c.items())


def test_tracemalloc_counts_a_large_tables_mapping():
    # (the memory benchmarks measure with tracemalloc: a mapping of its own must show in it)
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        t = inttable.IntTable()
        t.reserve(1_000_000)
        held = tracemalloc.get_traced_memory()[0] - before
        assert held >= t.__sizeof__() - 4096 >= 16 << 20
        del t
        assert tracemalloc.get_traced_memory()[0] - before < 1 << 20
    finally:
        tracemalloc.stop()
