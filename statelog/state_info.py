"""The stored description of a state (:class:`StateInfo`), its kind and its TTL.

What a checkpoint records about each state, so tools can read the state without the
operator's code (``docs/format.md``, "State description"). A description read from
checkpoint metadata (:meth:`StateInfo.from_json`) decodes its value types, which needs
pyarrow, when they are first used: reading metadata to list checkpoints and their states
does not load pyarrow. The descriptors an operator declares are :mod:`statelog.descriptors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from statelog.errors import ConfigError, CorruptionError

if TYPE_CHECKING:
    from statelog.types import ValueType

_TYPE_KINDS = ("pickle", "arrow")
_TYPES = ("value_type", "user_key_type")


class StateKind(StrEnum):
    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"


class TtlUpdate(StrEnum):
    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


@dataclass(frozen=True)
class TtlConfig:
    """Time-to-live of state entries, in milliseconds of the backend's clock.

    Expired entries are never returned; they are dropped lazily when read (a restore keeps
    them with their expiry, so they stay invisible).
    ``update`` decides whether reads refresh the expiry (``on_read_and_write``).
    """

    ttl_ms: int
    update: TtlUpdate = TtlUpdate.ON_CREATE_AND_WRITE

    def __post_init__(self) -> None:
        if type(self.ttl_ms) is not int or self.ttl_ms <= 0:
            raise ConfigError(f"TtlConfig.ttl_ms must be a positive int (milliseconds), got {self.ttl_ms!r}")
        object.__setattr__(self, "update", TtlUpdate(self.update))

    def to_json(self) -> dict[str, Any]:
        return {"ttl_ms": self.ttl_ms, "update": self.update.value}

    @staticmethod
    def from_json(obj: Any) -> TtlConfig | None:
        if obj is None:
            return None
        return TtlConfig(int(obj["ttl_ms"]), TtlUpdate(obj["update"]))


def _check_type_json(obj: Any) -> Any:
    """A value type's JSON form as far as it can be checked without decoding it."""
    if not isinstance(obj, dict) or obj.get("kind") not in _TYPE_KINDS or (
        obj["kind"] == "arrow" and not isinstance(obj.get("schema"), str)
    ):
        raise CorruptionError(f"invalid value type description {obj!r}")
    return obj


@dataclass(frozen=True)
class StateInfo:
    """The stored description of a state (from checkpoint metadata), without user code.

    One read by :meth:`from_json` keeps the JSON of its value types and decodes them when
    ``value_type`` or ``user_key_type`` is first read (:meth:`__getattr__`); ``to_json``
    writes that JSON back as it was read.
    """

    name: str
    kind: StateKind
    value_type: ValueType
    user_key_type: ValueType | None
    ttl: TtlConfig | None

    @staticmethod
    def from_descriptor(d: Any) -> StateInfo:
        """The description of a :class:`~statelog.descriptors.StateDescriptor`."""
        return StateInfo(d.name, d.kind, d.value_type, d.user_key_type, d.ttl)

    def to_json(self) -> dict[str, Any]:
        stored = self.__dict__.get("_types_json")
        if stored is not None:
            value_type, user_key_type = stored
        else:
            from statelog.types import type_to_json

            value_type = type_to_json(self.value_type)
            user_key_type = None if self.user_key_type is None else type_to_json(self.user_key_type)
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind.value,
            "value_type": value_type,
            "ttl": None if self.ttl is None else self.ttl.to_json(),
        }
        if user_key_type is not None:
            out["user_key_type"] = user_key_type
        return out

    @staticmethod
    def from_json(obj: Any) -> StateInfo:
        try:
            ukt = obj.get("user_key_type")
            types = (_check_type_json(obj["value_type"]), None if ukt is None else _check_type_json(ukt))
            info = object.__new__(StateInfo)
            for name, value in (
                ("name", obj["name"]),
                ("kind", StateKind(obj["kind"])),
                ("ttl", TtlConfig.from_json(obj.get("ttl"))),
                ("_types_json", types),
            ):
                object.__setattr__(info, name, value)
            return info
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise CorruptionError(f"invalid state description {obj!r}: {e}") from None

    def __getattr__(self, attr: str) -> Any:
        """Called only for an attribute that is not set: the value types of a description
        read by :meth:`from_json`, decoded here when first read."""
        stored = self.__dict__.get("_types_json")
        if stored is None or attr not in _TYPES:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        from statelog.types import type_from_json

        try:
            decoded = tuple(None if t is None else type_from_json(t) for t in stored)
        except (ValueError, TypeError) as e:  # base64 or Arrow IPC that does not decode
            raise CorruptionError(f"invalid value type description {stored!r} of state {self.name!r}: {e}") from None
        for name, value in zip(_TYPES, decoded, strict=True):
            object.__setattr__(self, name, value)
        self.__dict__.pop("_types_json", None)
        return self.__dict__[attr]
