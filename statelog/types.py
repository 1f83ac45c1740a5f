"""Value types of state: Arrow types with fast Python-side validation, or pickle.

A state descriptor declares its value type as a ``pyarrow.DataType`` so that changelog
blocks and (later) Parquet state tables get typed columns. :data:`PICKLE` declares
arbitrary Python objects, stored as pickled ``binary``.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from statelog.errors import CorruptionError, StateTypeError


class _PickleType:
    """Marker for the pickle fallback (arbitrary Python objects as ``binary``)."""

    def __repr__(self) -> str:
        return "PICKLE"

    def __reduce__(self) -> str:
        return "PICKLE"  # unpickles to the module's singleton: PICKLE is compared by identity


PICKLE = _PickleType()
ValueType = pa.DataType | _PickleType

_INT_BOUNDS = {
    pa.int8(): (-(1 << 7), (1 << 7) - 1),
    pa.int16(): (-(1 << 15), (1 << 15) - 1),
    pa.int32(): (-(1 << 31), (1 << 31) - 1),
    pa.int64(): (-(1 << 63), (1 << 63) - 1),
    pa.uint8(): (0, (1 << 8) - 1),
    pa.uint16(): (0, (1 << 16) - 1),
    pa.uint32(): (0, (1 << 32) - 1),
    pa.uint64(): (0, (1 << 64) - 1),
}


def check_value_type(value_type: Any, what: str) -> ValueType:
    if value_type is PICKLE or isinstance(value_type, pa.DataType):
        return value_type
    raise StateTypeError(
        f"{what}: the value type must be a pyarrow.DataType (e.g. pyarrow.int64()) or "
        f"statelog.PICKLE, got {value_type!r}"
    )


def arrow_type(value_type: ValueType) -> pa.DataType:
    """The Arrow type values are stored as (``binary`` for pickled values)."""
    return pa.binary() if value_type is PICKLE else value_type  # type: ignore[return-value]


def type_to_json(value_type: ValueType) -> dict[str, str]:
    if value_type is PICKLE:
        return {"kind": "pickle"}
    schema = pa.schema([pa.field("v", value_type)])
    return {
        "kind": "arrow",
        "type": str(value_type),
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
    }


def type_from_json(obj: Any) -> ValueType:
    if not isinstance(obj, dict) or obj.get("kind") not in ("pickle", "arrow"):
        raise CorruptionError(f"invalid value type description {obj!r}")
    if obj["kind"] == "pickle":
        return PICKLE
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(obj["schema"])))
    return schema.field("v").type


def _fail(state: str, value_type: Any, value: Any) -> StateTypeError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return StateTypeError(
        f"state {state!r} declares values of type {value_type}, got {type(value).__name__} {shown}; "
        "convert the value or declare another type (statelog.PICKLE stores any picklable object)"
    )


def make_validator(value_type: ValueType, state: str) -> Callable[[Any], None]:
    """A fast check that a Python value can be stored with ``value_type``.

    Raises :class:`StateTypeError` naming the state, the declared type and the value.
    """
    if value_type is PICKLE:

        def check_pickle(v: Any) -> None:
            try:
                pickle.dumps(v, protocol=5)
            except Exception as e:  # noqa: BLE001 - any pickling failure is a type error here
                raise StateTypeError(
                    f"state {state!r} stores pickled values, but {type(v).__name__} cannot be pickled: {e}"
                ) from None

        return check_pickle
    t = value_type
    if t in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[t]

        def check_int(v: Any) -> None:
            if type(v) is not int or not lo <= v <= hi:
                raise _fail(state, t, v)

        return check_int
    if pa.types.is_floating(t):

        def check_float(v: Any) -> None:
            if type(v) is not float and type(v) is not int:
                raise _fail(state, t, v)

        return check_float
    if pa.types.is_boolean(t):

        def check_bool(v: Any) -> None:
            if type(v) is not bool:
                raise _fail(state, t, v)

        return check_bool
    if pa.types.is_string(t) or pa.types.is_large_string(t):

        def check_str(v: Any) -> None:
            if type(v) is not str:
                raise _fail(state, t, v)

        return check_str
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):

        def check_bytes(v: Any) -> None:
            if type(v) is not bytes:
                raise _fail(state, t, v)

        return check_bytes

    def check_generic(v: Any) -> None:
        try:
            pa.scalar(v, type=t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            raise _fail(state, t, v) from None

    return check_generic


def fast_check(value_type: ValueType) -> tuple[type, int | None, int | None] | None:
    """``(python type, lo, hi)`` such that ``type(v) is python_type`` (and ``lo <= v <= hi``
    for ints) proves ``v`` valid; ``None`` when no such shortcut exists."""
    if value_type is PICKLE:
        return None
    t = value_type
    if t in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[t]
        return int, lo, hi
    if pa.types.is_floating(t):
        return float, None, None
    if pa.types.is_boolean(t):
        return bool, None, None
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str, None, None
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes, None, None
    return None


def to_arrow(values: list[Any], value_type: ValueType) -> pa.Array:
    """Convert Python values (``None`` allowed) to an Arrow array of the stored type."""
    if value_type is PICKLE:
        dumps = pickle.dumps
        return pa.array([None if v is None else dumps(v, protocol=5) for v in values], pa.binary())
    return pa.array(values, type=value_type)  # type: ignore[arg-type]


def from_arrow(array: pa.Array, value_type: ValueType) -> list[Any]:
    """Inverse of :func:`to_arrow`."""
    values = array.to_pylist()
    if value_type is PICKLE:
        loads = pickle.loads
        return [None if v is None else loads(v) for v in values]
    if pa.types.is_map(arrow_type(value_type)):
        return [None if v is None else dict(v) for v in values]
    return values
