"""Pickled values and keys render in ``format("statelog")`` exactly as docs/spark.md says."""

from __future__ import annotations

import pickle
from typing import Any

import statelog
from statelog import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from tests.support.s3server import RootSpec

VALUES: dict[str, Any] = {"s": "abc", "n": 42, "ns": "42", "d": {"a": 1}, "t": ("x", 2)}


def test_pickled_values_render_like_the_docs_say(spark: Any, small_root: RootSpec) -> None:
    job = statelog.open(small_root.url)
    try:
        b = job.backend("op")
        blob = b.get_state(ValueStateDescriptor("blob", statelog.PICKLE))
        items = b.get_state(ListStateDescriptor("items", statelog.PICKLE))
        attrs = b.get_state(MapStateDescriptor("attrs", statelog.PICKLE, key_type=statelog.PICKLE))
        for key, value in VALUES.items():
            b.set_current_key(key)
            blob.update(value)
            items.update([value, "y"])
            attrs.put(value if key != "d" else "dict", key)
        b.set_current_key(7)
        blob.update("seven")
        job.checkpoint()
    finally:
        job.close()

    def rows(state: str) -> dict[Any, Any]:
        df = (spark.read.format("statelog").option("root", small_root.url).option("operator", "op")
              .option("state", state).load())
        return {r["key"]: r for r in df.collect()}

    # a str as is (no quotes), anything else with repr; keys by the same rule
    blobs = rows("blob")
    assert {k: r["value"] for k, r in blobs.items()} == {
        "s": "abc", "n": "42", "ns": "42", "d": "{'a': 1}", "t": "('x', 2)", "7": "seven"}
    assert pickle.loads(blobs["n"]["value_pickle"]) == 42 and pickle.loads(blobs["ns"]["value_pickle"]) == "42"
    assert rows("items")["s"]["value"] == ["abc", "y"]
    assert rows("items")["t"]["value"] == ["('x', 2)", "y"]
    maps = rows("attrs")
    assert dict(maps["s"]["value"]) == {"abc": "s"}
    assert dict(maps["n"]["value"]) == {"42": "n"}
    assert dict(maps["t"]["value"]) == {"('x', 2)": "t"}
