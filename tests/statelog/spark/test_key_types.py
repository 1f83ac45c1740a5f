"""Typed key columns on normalized keys: keys are stored normalized (``True``
and ``1.0`` as the int ``1``), so option ``keyType`` converts them back to the declared type
(``double`` gives ``1.0``, ``boolean`` gives ``True``) or fails naming a key that does not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor

V = ValueStateDescriptor("v", pa.int64())


def _build(root: str) -> tuple[int, int]:
    """Operator "floats" keyed by floats (two integral), "flags" by bools; two checkpoints."""
    with statelog.open(root, max_parallelism=8) as job:
        fl, fg = job.backend("floats"), job.backend("flags")
        sf, sg = fl.get_state(V), fg.get_state(V)
        for i, k in enumerate([1.0, 2.5, -0.0]):
            fl.set_current_key(k)
            sf.update(i)
        c1 = job.checkpoint().checkpoint_id
        for i, k in enumerate([True, False]):
            fg.set_current_key(k)
            sg.update(i)
        fl.set_current_key(1.0)
        sf.update(10)
        fl.set_current_key(0.5)
        sf.update(11)
        c2 = job.checkpoint().checkpoint_id
    return c1, c2


def _read(spark: Any, root: str, operator: str, key_type: str, **options: Any) -> Any:
    r = spark.read.format("statelog").option("root", root).option("operator", operator).option("state", "v")
    r = r.option("keyType", key_type)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def test_key_type_converts_normalized_keys(spark: Any, tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    c1, c2 = _build(root)
    rows = _read(spark, root, "floats", "double", checkpoint=c2).collect()
    assert {r["key"]: r["value"] for r in rows} == {1.0: 10, 2.5: 1, 0.0: 2, 0.5: 11}
    assert all(type(r["key"]) is float for r in rows)
    flags = _read(spark, root, "flags", "boolean", checkpoint=c2).collect()
    assert {r["key"]: r["value"] for r in flags} == {True: 0, False: 1}
    assert all(type(r["key"]) is bool for r in flags)
    ints = _read(spark, root, "flags", "int64", checkpoint=c2).collect()
    assert {r["key"]: r["value"] for r in ints} == {1: 0, 0: 1}
    # the change feed converts the same way
    feed = _read(spark, root, "floats", "double", changesFrom=c1, changesTo=c2).collect()
    assert sorted((r["key"], r["value"]) for r in feed) == [(0.5, 11), (1.0, 10)]
    assert all(type(r["key"]) is float for r in feed)
    fflags = _read(spark, root, "flags", "boolean", changesFrom=c1, changesTo=c2).collect()
    assert sorted((r["key"], r["value"]) for r in fflags) == [(False, 1), (True, 0)]


def test_key_type_refuses_keys_that_do_not_fit(spark: Any, tmp_path: Path) -> None:
    root = (tmp_path / "root").as_uri()
    c1, c2 = _build(root)
    with pytest.raises(Exception, match=r'option "keyType": the declared key type is int64, but the state holds key 2\.5 of type float, which is not an integer'):
        _read(spark, root, "floats", "int64", checkpoint=c2).collect()
    with pytest.raises(Exception, match=r'option "keyType": the declared key type is int64, but the state holds key 0\.5 of type float'):
        _read(spark, root, "floats", "int64", changesFrom=c1, changesTo=c2).collect()
    with statelog.open(root) as job:
        b = job.backend("ints")
        st = b.get_state(V)
        b.set_current_key(2)
        st.update(1)
        c3 = job.checkpoint().checkpoint_id
    with pytest.raises(Exception, match=r'option "keyType": the declared key type is bool, but the state holds key 2 of type int, which is not a boolean'):
        _read(spark, root, "ints", "boolean", checkpoint=c3).collect()
