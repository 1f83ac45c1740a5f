"""The C fold of ``add_many`` (``add_into`` of statelog/_ext/fastpath.c, through
``batch_reductions.fold_into_dict``) gives what the Arrow path gives: the same table
contents, the same changelog columns, the same errors; and it changes nothing when it
declines a batch or fails."""

from __future__ import annotations

import importlib
import operator
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import statelog
import statelog.state.batch_reductions as br
from statelog import AggregatingStateDescriptor, ReducingStateDescriptor, TtlConfig
from statelog.state.batch import CountAggregate
from statelog.state.keyed import NONE_NS
from tests.support.harness import Clock

I64_MAX = 2**63 - 1
try:  # (imported here even with STATELOG_PURE_PYTHON set, to compare it with the Arrow path)
    fp = importlib.import_module("statelog._ext.fastpath")
except ImportError:
    fp = None
needs_ext = pytest.mark.skipif(fp is None, reason="statelog/_ext/fastpath.c is not built")


def test_the_fold_is_built():
    assert fp is not None and fp.add_into is not None, "statelog/_ext/fastpath.c was not built: run `make venv`"


def test_pure_python_switch_leaves_the_fold_to_arrow():
    code = "import statelog.state.batch_reductions as br, sys; sys.exit(0 if br._add_into is None else 1)"
    env = {"STATELOG_PURE_PYTHON": "1", "PATH": "/usr/bin:/bin"}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def _descriptor(kind: str, vt: pa.DataType, ttl: bool = False):
    cfg = {"ttl": TtlConfig(10_000)} if ttl else {}
    if kind == "count":
        return AggregatingStateDescriptor("s", vt, aggregate=CountAggregate(), **cfg)
    fn = {"sum": operator.add, "min": min, "max": max}[kind]
    return ReducingStateDescriptor("s", vt, reduce_fn=fn, **cfg)


# batches of (keys, values); ("put", key, value) writes a stored value directly (a value the
# per-record calls would not store: the fold must decline it as the Arrow path reads it);
# ("ns", name) switches the namespace
BATCHES = [
    (list(range(40)), list(range(40))),
    (pa.array(np.arange(60) % 50), pa.array(np.arange(60) - 30)),
    ([3, 3, 100, 7], [1, -2, 5, 0]),
    ("ns", "w"),
    ([1, 2, 1], [9, 9, 9]),
    ("ns", None),
    (["a", "b", "a"], [4, 5, 6]),
    ([4, 5, 200], [1, I64_MAX, 1]),  # the sum of key 5 leaves int64 (after key 4 was written)
    ([300], [120]),
    ([299, 300], [1, 10]),  # 130 leaves int8 (after the new key 299 was written)
    ([8, 8, 9], [100, 100, 1]),  # a partial sum of 200 leaves int8
    ([-(2**31), 2**40], [2**31 - 1, -5]),
    ("put", 10, True),
    ([9, 10, 11], [1, 1, 1]),
    ("put", 12, 2**70),
    ([12, 13], [1, 1]),
    ("put", 14, 2.5),
    ([14], [1]),
    ("put", 15, "x"),
    ([1, 15], [1, 1]),
    ("put", 15, 1),
    ([1, 15], [1, 1]),
]


def _run(root, monkeypatch, c: bool, kind: str, vt: pa.DataType, store: str = "memory", ttl: bool = False):
    """Every batch of BATCHES: outcomes, changelog columns, entries, entries after restore,
    and how often the C fold folded and declined."""
    calls = {True: 0, False: 0}

    def spy(*args):
        done = fold(*args)
        calls[done] += 1
        return done

    fold = fp.add_into
    monkeypatch.setattr(br, "_fastpath", fp)
    monkeypatch.setattr(br, "_add_into", spy if c else None)
    job = statelog.open(root.as_uri(), state_store=store)
    if store == "disk":
        job.state_cache_entries = 8
    b = job.backend("op", clock=Clock(1000))  # (the same expiry times in both runs)
    st = b.get_state(_descriptor(kind, vt, ttl))
    written = []
    append = st._stream.append_columns

    def record(cols, kg_range=None):
        written.append([(str(col.type), col.to_pylist()) if isinstance(col, pa.Array) else list(col) for col in cols])
        return append(cols, kg_range)

    monkeypatch.setattr(st._stream, "append_columns", record)
    outcomes = []
    for step in BATCHES:
        if step[0] == "ns":
            st.set_namespace(step[1])
            continue
        if step[0] == "put":
            if store == "memory" and not ttl:
                st._tables[NONE_NS][step[1]] = step[2]
            continue
        keys, vals = step
        try:
            st.add_many(keys, None if kind == "count" else vals)
            outcomes.append("ok")
        except Exception as e:  # (the same, whatever it is)
            outcomes.append(f"{type(e).__name__}: {e}")
    entries = sorted(((k, ns, type(v).__name__, v) for k, ns, v in st.entries()), key=repr)
    if store == "memory" and not ttl:
        for nsb in list(st._tables):  # back to values a restore can encode
            st._tables[nsb] = {k: v for k, v in st._tables[nsb].items() if type(v) is int and -(2**63) <= v <= I64_MAX}
    meta = job.checkpoint(sources={})
    job.close()
    rjob = statelog.open(root.as_uri(), state_store=store)
    r = rjob.backend("op", restore=meta, clock=Clock(1000))
    restored = sorted(r.get_state(_descriptor(kind, vt, ttl)).entries(), key=repr)
    rjob.close()
    return outcomes, written, entries, restored, calls


TYPES = [pa.int64(), pa.int8(), pa.int16(), pa.uint32(), pa.uint64()]


@needs_ext
@pytest.mark.parametrize("vt", TYPES, ids=str)
@pytest.mark.parametrize("kind", ["sum", "count", "min", "max"])
def test_the_c_fold_equals_the_arrow_path(tmp_path, monkeypatch, kind, vt):
    c = _run(tmp_path / "c", monkeypatch, True, kind, vt)
    py = _run(tmp_path / "py", monkeypatch, False, kind, vt)
    assert c[:4] == py[:4]
    unfit = "StateTypeError: state 's': the batch's result does not fit the declared type"
    assert any(o.startswith(unfit) for o in py[0]), py[0]
    if kind == "sum" and vt == pa.int64():
        assert f"{unfit} int64: overflow" in py[0]
    if vt == pa.uint64():  # not within int64: the Arrow path
        assert c[4] == {True: 0, False: 0}
    else:
        assert c[4][True] > 0 and c[4][False] > 0, c[4]  # it folded batches and declined some


@needs_ext
@pytest.mark.parametrize("store, ttl", [("disk", False), ("memory", True)])
def test_the_disk_working_set_and_ttl_fold_as_the_arrow_path(tmp_path, monkeypatch, store, ttl):
    """The disk-backed working set hands the fold its resident dict (or a view when the batch's
    keys are not all resident: the Arrow path); TTL entries are the Arrow path's."""
    c = _run(tmp_path / "c", monkeypatch, True, "sum", pa.int64(), store, ttl)
    py = _run(tmp_path / "py", monkeypatch, False, "sum", pa.int64(), store, ttl)
    assert c[:4] == py[:4]
    assert (c[4][True] > 0) is not ttl


def _fold(table, keys, partial, op, lo=-(2**63), hi=I64_MAX, ints=False):
    """add_into over ``keys`` as a list or (``ints``) as an int64 array."""
    out = np.zeros(len(keys), np.int64)
    done = fp.add_into(table, np.array(keys, np.int64) if ints else keys, np.array(partial, np.int64), out, op, lo, hi)
    return done, out.tolist()


@needs_ext
@pytest.mark.parametrize("ints", [False, True], ids=["list", "int64s"])
@pytest.mark.parametrize("fold, stored, partial, lo, hi", [
    ("FOLD_SUM", I64_MAX, 1, -(2**63), I64_MAX),  # int64 overflow
    ("FOLD_SUM", -(2**63), -1, -(2**63), I64_MAX),
    ("FOLD_SUM", 100, 28, -128, 127),  # leaves int8
    ("FOLD_MAX", 100, 128, -128, 127),
    ("FOLD_MIN", True, 1, -(2**63), I64_MAX),  # not an exact int
    ("FOLD_SUM", 2**64, 1, -(2**63), I64_MAX),  # not an int64
    ("FOLD_MAX", 300, 1, -128, 127),  # not an int8
    ("FOLD_SUM", "1", 1, -(2**63), I64_MAX),
])
def test_add_into_declines_with_the_table_unchanged(fold, stored, partial, lo, hi, ints):
    """A declined batch leaves the entries that it changed before the bad key as they were
    (absent entries absent again)."""
    table = {0: 5, 1: 6, 9: stored}
    before = dict(table)
    done, _ = _fold(table, [0, 1, 2, 9, 3], [1, 1, 1, partial, 1], getattr(fp, fold), lo, hi, ints)
    assert done is False
    assert table == before and [type(v) for v in table.values()] == [type(v) for v in before.values()]


@needs_ext
@pytest.mark.parametrize("ints", [False, True], ids=["list", "int64s"])
def test_add_into_folds_and_writes_the_new_values(ints):
    table = {1: 10, 2: -3}
    kept = table[1]
    assert _fold(table, [0, 1, 2], [5, 1, 4], fp.FOLD_SUM, ints=ints) == (True, [5, 11, 1])
    assert table == {1: 11, 2: 1, 0: 5}
    table = {1: kept, 2: -3}
    assert _fold(table, [0, 1, 2], [5, 11, -4], fp.FOLD_MIN, ints=ints) == (True, [5, 10, -4])
    assert table == {1: 10, 2: -4, 0: 5} and table[1] is kept  # unchanged: not rewritten
    assert _fold(table, [0, 1, 2], [7, 7, 7], fp.FOLD_MAX, ints=ints) == (True, [7, 10, 7])
    assert _fold({}, [], [], fp.FOLD_SUM, ints=ints) == (True, [])


@needs_ext
def test_dicts_are_laid_out_as_the_prefetching_reads_them():
    """The fold prefetches a large table's lines ahead of its lookups from the dict's layout,
    which the extension checks at import; on the CPython versions it knows, it must pass."""
    known = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 12)
    assert int(known) == fp.DICT_PREFETCH


def _reference(table, keys, partial, op):
    fn = {fp.FOLD_SUM: operator.add, fp.FOLD_MIN: min, fp.FOLD_MAX: max}[op]
    out = []
    for k, p in zip(keys, partial, strict=True):
        cur = table.get(k)
        table[k] = p if cur is None and op != fp.FOLD_SUM else fn(0 if cur is None else cur, p)
        out.append(table[k])
    return out


@needs_ext
@pytest.mark.parametrize("kind", ["ints", "int64s", "strs", "mixed"])
def test_the_prefetching_fold_of_large_tables_equals_the_reference(kind):
    """Folds into tables large enough to be prefetched, with deleted entries (dummy slots),
    keys present, deleted and new, batches that resize the table, and (mixed) keys whose
    hash the prefetching does not run: the same tables and values as a loop in Python."""
    rng = np.random.default_rng(len(kind))
    n = 60_000

    def key(i):
        if kind == "strs" or (kind == "mixed" and i % 3 == 0):
            return f"k{i}"
        return (i, 1) if kind == "mixed" and i % 3 == 1 else i

    table = {key(i): i for i in range(0, 2 * n, 2)}
    for i in range(0, 2 * n, 8):
        del table[key(i)]
    want = dict(table)
    for size, op in ((5_000, fp.FOLD_SUM), (40_000, fp.FOLD_MAX), (150_000, fp.FOLD_MIN), (7, fp.FOLD_SUM)):
        ids = np.unique(rng.integers(-50, 4 * n, size))
        keys = [key(i) for i in ids.tolist()]
        partial = rng.integers(-1000, 1000, len(keys)).tolist()
        expect = _reference(want, keys, partial, op)
        done, out = _fold(table, ids if kind == "int64s" else keys, partial, op, ints=kind == "int64s")
        assert done is True and out == expect
        assert table == want and list(table) == list(want)  # (insertion order too)


@needs_ext
@pytest.mark.parametrize("bits", [0, 1, 7, 11, 12, 23, 33, 62, 63])
def test_radix_sort_equals_numpys(bits):
    rng = np.random.default_rng(bits)
    for n in (0, 1, 2, 1000, 50_000):
        a = rng.integers(0, max(1, 2**bits) if bits < 63 else I64_MAX, n, dtype=np.int64)
        if n > 2:
            a[: n // 4] = a[n // 2]  # runs of one value, and a digit every value shares
        b = a.copy()
        fp.radix_sort(b, bits)
        assert (b == np.sort(a)).all()


@needs_ext
def test_radix_sort_refuses_values_out_of_range():
    for values, bits in (([5, -1], 10), ([5, 1024], 10), ([1], 64)):
        a = np.array(values, np.int64)
        before = a.copy()
        with pytest.raises(ValueError):
            fp.radix_sort(a, bits)
        assert (a == before).all()
    with pytest.raises(TypeError, match="int64s"):
        fp.radix_sort(np.zeros(4, np.int32), 8)


@needs_ext
def test_add_into_refuses_bad_arguments():
    out = np.zeros(2, np.int64)
    with pytest.raises(TypeError, match="must be a dict"):
        fp.add_into({}.items(), [1, 2], np.ones(2, np.int64), out, fp.FOLD_SUM, 0, 9)
    with pytest.raises(TypeError, match="partial must be 2 int64s"):
        fp.add_into({}, [1, 2], np.ones(2, np.int32), out, fp.FOLD_SUM, 0, 9)
    with pytest.raises(TypeError, match="out must be 2 int64s"):
        fp.add_into({}, [1, 2], np.ones(2, np.int64), np.zeros(3, np.int64), fp.FOLD_SUM, 0, 9)
    with pytest.raises(ValueError, match="unknown fold"):
        fp.add_into({}, [1, 2], np.ones(2, np.int64), out, 7, 0, 9)
    for keys in (np.ones(2, np.int32), (1, 2)):
        with pytest.raises(TypeError, match="keys must be a list or a buffer of int64s"):
            fp.add_into({}, keys, np.ones(2, np.int64), out, fp.FOLD_SUM, 0, 9)
    with pytest.raises(TypeError, match="partial must be 3 int64s"):
        fp.add_into({}, np.ones(3, np.int64), np.ones(2, np.int64), out, fp.FOLD_SUM, 0, 9)
    table = {}
    with pytest.raises(TypeError, match="unhashable"):
        fp.add_into(table, [1, [2]], np.ones(2, np.int64), out, fp.FOLD_SUM, 0, 9)
    assert table == {}  # the key before the failure is put back
