"""State descriptors: the name, kind, value type and TTL of a keyed state.

Descriptors are what an operator declares; the backend creates the state from them and
records their description (:class:`~statelog.state_info.StateInfo`, ``StateInfo.to_json``) in
every checkpoint, so tools can read the state without the operator's code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from statelog.errors import ConfigError
from statelog.state_info import StateInfo, StateKind, TtlConfig
from statelog.state_info import TtlUpdate as TtlUpdate
from statelog.types import PICKLE, ValueType, check_value_type, type_to_json

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def check_state_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name.startswith("__"):
        raise ConfigError(
            f"invalid state name {name!r}: use 1-128 characters of letters, digits, '_', '.', '-', "
            "not starting with '__' (reserved)"
        )
    return name


ACC = TypeVar("ACC")
IN = TypeVar("IN")
OUT = TypeVar("OUT")


class AggregateFunction(Protocol[IN, ACC, OUT]):
    """Flink-style aggregate function used by aggregating state."""

    def create_accumulator(self) -> ACC: ...

    def add(self, value: IN, accumulator: ACC) -> ACC: ...

    def get_result(self, accumulator: ACC) -> OUT: ...


@dataclass(frozen=True)
class StateDescriptor:
    """Base of all descriptors. ``value_type`` is the stored type (accumulator for aggregating)."""

    name: str
    value_type: ValueType
    ttl: TtlConfig | None = None
    kind: StateKind = field(default=StateKind.VALUE, init=False)

    def __post_init__(self) -> None:
        check_state_name(self.name)
        check_value_type(self.value_type, f"state {self.name!r}")
        if self.ttl is not None and not isinstance(self.ttl, TtlConfig):
            raise ConfigError(
                f"state {self.name!r}: ttl must be a statelog.TtlConfig or None, got {self.ttl!r} "
                "(pass other options by keyword, e.g. key_type=...)"
            )

    @property
    def user_key_type(self) -> ValueType | None:
        return None

    def compatible_with(self, stored: StateInfo) -> str | None:
        """Why this descriptor cannot take over the stored state, or ``None`` if it can."""
        if stored.kind != self.kind:
            return f"it was stored as {stored.kind.value} state, now declared as {self.kind.value}"
        if type_to_json(stored.value_type)["kind"] != type_to_json(self.value_type)["kind"] or (
            stored.value_type is not PICKLE and stored.value_type != self.value_type
        ):
            return f"its value type was {stored.value_type}, now declared as {self.value_type}"
        if stored.user_key_type != self.user_key_type and not (
            stored.user_key_type is PICKLE and self.user_key_type is PICKLE
        ):
            return f"its map key type was {stored.user_key_type}, now declared as {self.user_key_type}"
        return None


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """A single value per key and namespace. ``default`` is returned when none is set."""

    default: Any = None
    kind: StateKind = field(default=StateKind.VALUE, init=False)


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list per key and namespace; ``value_type`` is the element type."""

    kind: StateKind = field(default=StateKind.LIST, init=False)


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A map per key and namespace from ``key_type`` to ``value_type``."""

    key_type: ValueType = field(default_factory=pa.string)
    kind: StateKind = field(default=StateKind.MAP, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_value_type(self.key_type, f"map state {self.name!r} (key type)")

    @property
    def user_key_type(self) -> ValueType | None:
        return self.key_type


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    """A value per key and namespace folded with ``reduce_fn(accumulated, new)``."""

    reduce_fn: Callable[[Any, Any], Any] | None = None
    kind: StateKind = field(default=StateKind.REDUCING, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_fn):
            raise ConfigError(f"reducing state {self.name!r} needs a callable reduce_fn(a, b)")


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor, Generic[IN, ACC, OUT]):
    """An accumulator per key and namespace; ``value_type`` is the accumulator's type."""

    aggregate: AggregateFunction[IN, ACC, OUT] | None = None
    kind: StateKind = field(default=StateKind.AGGREGATING, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        agg = self.aggregate
        if agg is None or not all(
            callable(getattr(agg, m, None)) for m in ("create_accumulator", "add", "get_result")
        ):
            raise ConfigError(
                f"aggregating state {self.name!r} needs an aggregate function with "
                "create_accumulator(), add(value, acc) and get_result(acc)"
            )
