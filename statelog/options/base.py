"""The base of the option objects: a frozen dataclass per group of options.

A group of options (the changelog writer's, the materializer daemon's, the runtime job's, ...)
is a frozen dataclass whose fields carry their default, their one-line doc and their check (a
range of :mod:`statelog.options.values` or a function), declared with :func:`option`;
:meth:`Options.from_mapping` is the one place an unknown name is refused. The library, the
runtime and the CLI all build the same objects, so a new field is accepted everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, field, fields
from typing import Any, ClassVar, TypeVar

from statelog.errors import ConfigError
from statelog.options.values import Count, Duration, Size

Check = Callable[[str, Any], Any]  # (label, value) -> the checked value, or ConfigError


def option(
    default: Any, doc: str, check: Duration | Size | Count | Check | None = None, *, none_ok: bool = False,
    **meta: Any,
) -> Any:
    """A field of an option object: ``default``, a one-line ``doc`` and a ``check`` (a range
    object, or a function ``(label, value) -> value``); ``meta`` is kept for the CLI (e.g.
    ``flag="--interval"``). A field whose default is ``None`` (or with ``none_ok``) also
    accepts ``None``."""
    return field(default=default, metadata={"doc": doc, "check": check, "none_ok": none_ok, **meta})


def check_bool(label: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{label} must be True or False, got {value!r}")
    return value


def check_optional_bool(label: str, value: Any) -> bool | None:
    return None if value is None else check_bool(label, value)


_O = TypeVar("_O", bound="Options")


class Options:
    """Base of the frozen option dataclasses (``WriterOptions``, ``MaterializerOptions``, ``JobConfig``, ...)."""

    KIND: ClassVar[str] = "option"  # how errors name one of these options

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not (value is None and (f.default is None or f.metadata.get("none_ok"))):
                object.__setattr__(self, f.name, self.check_field(f.name, value))

    @classmethod
    def check_field(cls, name: str, value: Any, label: str | None = None) -> Any:
        """``value`` of field ``name`` checked (a text like ``"30s"`` converted); ``label``
        names it in the error (default: :meth:`label`; the CLI passes its flag)."""
        check = cls.field_map()[name].metadata.get("check")
        label = label or cls.label(name)
        if check is None:
            return value
        if isinstance(check, Duration | Size | Count):
            return check.check(value, label)
        return check(label, value)

    @classmethod
    def label(cls, name: str) -> str:
        """How errors name option ``name``: ``"<KIND> <name>"``."""
        return f"{cls.KIND} {name}"

    @classmethod
    def field_map(cls) -> dict[str, Any]:
        return {f.name: f for f in fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def from_mapping(cls: type[_O], options: Mapping[str, Any] | _O | None) -> _O:
        """The options of a dict (or the object itself, or the defaults for ``None``): the one
        place an unknown option name is refused."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"{cls.KIND}s must be a dict or a {cls.__name__}, got {type(options).__name__}"
            )
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ConfigError(f"unknown {cls.KIND}(s) {unknown}; valid: {cls.names()}")
        return cls(**options)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            default = f.default if f.default is not MISSING else None
            if getattr(self, f.name) != default:
                out[f.name] = getattr(self, f.name)
        return out
