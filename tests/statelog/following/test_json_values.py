"""The JSON encoding of state values and keys that ``statelog serve`` and ``statelog.query`` share."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import pytest

from statelog.errors import ConfigError
from statelog.following.json_values import from_json, key_from_json, to_json


@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2**70, 1.5, "x", "", b"\x00\xff", [1, "a", None], {"a": [1, {"b": b"z"}]},
    {(0, "k"): "v", 3: b"q"}, {"$bytes": "not bytes"}, {}, dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
    dt.date(2026, 1, 2), dt.time(3, 4, 5), Decimal("12.3400"), dt.timedelta(days=2, microseconds=3),
    math.inf, -math.inf,
])  # fmt: skip
def test_values_round_trip_through_json_text(value: Any) -> None:
    text = json.dumps(to_json(value), allow_nan=False)
    assert from_json(json.loads(text)) == value


def test_nan_tuples_and_other_objects() -> None:
    assert math.isnan(from_json(json.loads(json.dumps(to_json(math.nan), allow_nan=False))))
    assert from_json(to_json((1, (2, "x")))) == [1, [2, "x"]]  # a tuple value comes back as a list
    assert to_json({"$x": 1}) == {"$map": [["$x", 1]]}  # a "$" key cannot be mistaken for an encoding
    other = to_json(object())
    assert set(other) == {"$repr", "$type"} and other["$type"] == "builtins.object"


def test_keys_from_json() -> None:
    assert key_from_json([3, ["x", None]]) == (3, ("x", None))
    assert key_from_json({"$bytes": "AP8="}) == b"\x00\xff"
    assert key_from_json(1.5) == 1.5 and key_from_json("user-42") == "user-42"
    with pytest.raises(ConfigError, match=r"namespace: expected a JSON string, number.*got \{'a': 1\}"):
        key_from_json({"a": 1}, "namespace")
    with pytest.raises(ConfigError, match="key: \\$bytes expects base64 text"):
        key_from_json({"$bytes": "not base64!"})
