"""State values and keys as JSON, for ``statelog serve`` and its client (:func:`statelog.query`).

A value JSON can hold is sent as itself: ``None``, ``bool``, ``int``, ``str``, a finite
``float``, a list (a tuple is sent as a list), a dict whose keys are strings not starting
with ``$``. Anything else is an object with one ``$``-key that says how to read it:

* ``{"$bytes": "<base64>"}``: ``bytes``;
* ``{"$float": "nan" | "inf" | "-inf"}``: a float JSON has no number for;
* ``{"$map": [[key, value], ...]}``: a dict with a key that is not a string (a tuple key is
  a list) or a string starting with ``$``;
* ``{"$datetime": "<ISO 8601>"}``, ``{"$date": ...}``, ``{"$time": ...}``,
  ``{"$decimal": "<digits>"}``, ``{"$timedelta_us": <microseconds>}``;
* ``{"$repr": "<repr>", "$type": "<module.class>"}``: any other object (e.g. a pickled
  value's class), for people to read; :func:`from_json` leaves it as that dict.

Keys and namespaces in a request are JSON values too: a string, number, boolean or null, a
list for a tuple key (lists become tuples, also inside), ``{"$bytes": ...}`` for a bytes key.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
from decimal import Decimal
from typing import Any

from statelog.errors import ConfigError

__all__ = ["from_json", "key_from_json", "to_json"]

_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
KEY_EXPECTED = (
    "a JSON string, number, true/false, null, a list of these for a tuple key, or "
    '{"$bytes": "<base64>"} for a bytes key'
)


def to_json(value: Any) -> Any:
    """``value`` as a JSON-serializable object (the encoding of the module docstring)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"$map": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, dt.timedelta):
        return {"$timedelta_us": value // dt.timedelta(microseconds=1)}
    t = type(value)
    return {"$repr": repr(value), "$type": f"{t.__module__}.{t.__qualname__}"}


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def from_json(obj: Any) -> Any:
    """The value :func:`to_json` encoded (a tuple comes back as a list, except as a map key)."""
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, payload), = obj.items()
        if tag == "$bytes":
            return base64.b64decode(payload)
        if tag == "$float":
            return _FLOATS[payload]
        if tag == "$map":
            return {_hashable(from_json(k)): from_json(v) for k, v in payload}
        if tag == "$datetime":
            return dt.datetime.fromisoformat(payload)
        if tag == "$date":
            return dt.date.fromisoformat(payload)
        if tag == "$time":
            return dt.time.fromisoformat(payload)
        if tag == "$decimal":
            return Decimal(payload)
        if tag == "$timedelta_us":
            return dt.timedelta(microseconds=payload)
    return {k: from_json(v) for k, v in obj.items()}


def key_from_json(obj: Any, what: str = "key") -> Any:
    """A key (or namespace) given as JSON: lists become tuples; ``ConfigError`` for anything
    that is not a key (an object other than ``{"$bytes": ...}``)."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, list):
        return tuple(key_from_json(v, what) for v in obj)
    if isinstance(obj, dict) and set(obj) == {"$bytes"} and isinstance(obj["$bytes"], str):
        try:
            return base64.b64decode(obj["$bytes"], validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{what}: $bytes expects base64 text, got {obj['$bytes'][:40]!r}") from None
    shown = repr(obj)
    raise ConfigError(f"{what}: expected {KEY_EXPECTED}; got {shown[:80]}")
