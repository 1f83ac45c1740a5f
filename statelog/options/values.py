"""The value types of options: durations, sizes, counts and names, each with its valid range.

The library (``statelog.open`` / the changelog writer, the materializer daemon, the runtime's
``StreamExecutionEnvironment``) and the ``statelog`` CLI declare each option's range with these
types, so that an option means the same and has the same range everywhere. A value outside its
range is a :class:`~statelog.errors.ConfigError` that names the option, the range and the value;
the CLI prints it as one line and exits 2.

* :class:`Duration`: seconds, from a number or (CLI) a text ``"500ms"``, ``"30s"``,
  ``"10m"``, ``"1h"``, ``"2d"`` or plain seconds (:func:`parse_duration`);
* :class:`Size`: bytes, from an int or (CLI) a text ``"256MB"``, ``"1GiB"``, ``"64k"`` or
  plain bytes, binary units (:func:`parse_size`);
* :class:`Count`: a whole number in a range (from an int or a text of digits);
* :func:`non_empty_name`: a name (owner of a lease, ...) that is not empty or blank and
  holds no control character;
* :func:`parse_checkpoint_ref`: the one parser of checkpoint references ``latest``, an id,
  ``savepoint:NAME`` (and ``none`` where a fresh start is allowed).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from statelog.errors import ConfigError

MS = 0.001
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

_DURATION_UNITS = {"ms": MS, "s": 1.0, "m": MINUTE, "min": MINUTE, "h": HOUR, "d": DAY}
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": KIB, "kb": KIB, "kib": KIB,
    "m": MIB, "mb": MIB, "mib": MIB,
    "g": GIB, "gb": GIB, "gib": GIB,
    "t": TIB, "tb": TIB, "tib": TIB,
}  # fmt: skip
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_duration(text: str) -> float:
    """``"30s"``, ``"10m"``, ``"1h"``, ``"500ms"``, ``"1.5s"``, ``"2d"`` or plain seconds (``"45"``)."""
    m = _NUMBER_UNIT.match(text or "")
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in _DURATION_UNITS):
        raise ConfigError(
            f"invalid duration {text!r}: use a number with an optional unit ms, s, m, h or d "
            "(e.g. 30s, 10m, 1h; a plain number is seconds)"
        )
    return float(m.group(1)) * _DURATION_UNITS[unit or "s"]


def parse_size(text: str) -> int:
    """``"256MB"``, ``"1GiB"``, ``"64k"`` or plain bytes (``"1000"``); units are binary (MB = MiB)."""
    m = _NUMBER_UNIT.match(text or "")
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"invalid size {text!r}: use a number of bytes with an optional unit B, KB, MB, GB or "
            "TB (binary: 1 MB = 1 MiB = 1048576 bytes), e.g. 256MB, 1GiB, 1000"
        )
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if value != int(value):
        raise ConfigError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_duration(seconds: float) -> str:
    """``0.001`` -> ``"1ms"``, ``30`` -> ``"30s"``, ``86400`` -> ``"1d"`` (for range messages)."""
    for unit, scale in (("d", DAY), ("h", HOUR), ("m", MINUTE), ("s", 1.0), ("ms", MS)):
        if seconds >= scale or unit == "ms":
            value = seconds / scale
            return f"{value:g}{unit}"
    raise AssertionError("unreachable")


def format_size(n: int) -> str:
    for unit, scale in (("TB", TIB), ("GB", GIB), ("MB", MIB), ("KB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B" if n != 1 else "1 byte"


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and not math.isnan(value)


@dataclass(frozen=True)
class Duration:
    """A duration option in seconds, valid in ``[min_s, max_s]``."""

    name: str  # as the library spells it, e.g. "lease_ttl_s"
    min_s: float
    max_s: float
    hint: str = ""  # said when a value is below the range: why a shorter one is no good

    @property
    def range(self) -> str:
        return f"[{format_duration(self.min_s)}, {format_duration(self.max_s)}]"

    def check(self, value: Any, option: str | None = None) -> float:
        """``value`` (seconds, or a text like ``"30s"``) in range, else :class:`ConfigError`.

        ``option`` names the option in the message (e.g. the CLI flag ``--lease-ttl``)."""
        name = option or self.name
        if isinstance(value, str):
            try:
                value = parse_duration(value)
            except ConfigError as e:
                raise ConfigError(f"{name}: {e}") from None
        if not _is_number(value):
            raise ConfigError(f"{name} must be a duration in seconds in {self.range}, got {value!r}")
        if not self.min_s <= value <= self.max_s:
            raise ConfigError(
                f"{name} must be in {self.range}, got {format_duration(value) if value > 0 else value}"
                f"{self._hint(value)}"
            )
        return float(value)

    def _hint(self, value: float) -> str:
        return "; " + self.hint if self.hint and value < self.min_s else ""


@dataclass(frozen=True)
class Size:
    """A size option in bytes, valid in ``[min_bytes, max_bytes]``."""

    name: str
    min_bytes: int
    max_bytes: int

    @property
    def range(self) -> str:
        return f"[{format_size(self.min_bytes)}, {format_size(self.max_bytes)}]"

    def check(self, value: Any, option: str | None = None) -> int:
        name = option or self.name
        if isinstance(value, str):
            try:
                value = parse_size(value)
            except ConfigError as e:
                raise ConfigError(f"{name}: {e}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be a whole number of bytes in {self.range}, got {value!r}")
        if not self.min_bytes <= value <= self.max_bytes:
            raise ConfigError(f"{name} must be in {self.range}, got {value} bytes")
        return value


@dataclass(frozen=True)
class Count:
    """A whole-number option valid in ``[low, high]``."""

    name: str
    low: int
    high: int

    @property
    def range(self) -> str:
        return f"[{self.low}, {self.high}]"

    def check(self, value: Any, option: str | None = None) -> int:
        name, given = option or self.name, value
        if isinstance(value, str):
            text = value.strip()
            if not text.isdigit():
                raise ConfigError(f"{name}: invalid count {given!r}; use a whole number in {self.range}")
            value = int(text)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be a whole number in {self.range}, got {value!r}")
        if not self.low <= value <= self.high:
            raise ConfigError(f"{name}: invalid count {given!r}; use a whole number in {self.range}")
        return value


MAX_NAME_LENGTH = 200


def check_port(label: str, value: Any) -> int | None:
    """A TCP port 0..65535 (0: any free port), or ``None`` (no server)."""
    if value is None:
        return None
    if type(value) is str and value.strip().isdigit():
        value = int(value)
    if type(value) is not int or not 0 <= value <= 65535:
        raise ConfigError(f"{label} must be a TCP port 0..65535 (0: any free port) or None (off), got {value!r}")
    return value


def non_empty_name(name: str, value: Any, *, max_length: int = MAX_NAME_LENGTH) -> str:
    """``value`` as given if it is a non-blank str of at most ``max_length`` characters
    without control characters; never silently replaced by a default."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ConfigError(
            f"{name} must not be empty or blank, got {value!r}; give a name, or leave the option out "
            "for the default"
        )
    if len(value) > max_length:
        raise ConfigError(f"{name} must be at most {max_length} characters, got {len(value)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{name} must not contain control characters, got {value!r}")
    return value


# -- checkpoint references -----------------------------------------------------------------------

SAVEPOINT_REF_PREFIX = "savepoint:"


@dataclass(frozen=True)
class CheckpointRef:
    """A parsed checkpoint reference: ``kind`` is ``latest``, ``id``, ``savepoint`` or ``none``."""

    kind: str
    checkpoint_id: int | None = None
    savepoint: str | None = None

    def __str__(self) -> str:
        if self.kind == "id":
            return str(self.checkpoint_id)
        if self.kind == "savepoint":
            return f"{SAVEPOINT_REF_PREFIX}{self.savepoint}"
        return self.kind


def parse_checkpoint_ref(value: Any, option: str = "checkpoint", *, allow_none: bool = False) -> CheckpointRef:
    """The one parser of checkpoint references: ``latest``, a checkpoint id (int or digits),
    ``savepoint:NAME`` and, with ``allow_none``, ``none`` (start fresh). The savepoint name is
    checked when the savepoint is loaded (``statelog.layout.check_savepoint_name``)."""
    expected = '"latest", a checkpoint id or "savepoint:NAME"' + (' or "none"' if allow_none else "")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{option} must be {expected}, got {value!r}")
        return CheckpointRef("id", checkpoint_id=value)
    if not isinstance(value, str):
        raise ConfigError(f"{option} must be {expected}, got {type(value).__name__} {value!r}")
    text = value.strip()
    if text.lower() == "latest":
        return CheckpointRef("latest")
    if allow_none and text.lower() == "none":
        return CheckpointRef("none")
    if text.isdigit():
        return CheckpointRef("id", checkpoint_id=int(text))
    if text.startswith(SAVEPOINT_REF_PREFIX):
        name = text[len(SAVEPOINT_REF_PREFIX):]
        if not name:
            raise ConfigError(f"{option}: {value!r} names no savepoint; use savepoint:NAME")
        return CheckpointRef("savepoint", savepoint=name)
    raise ConfigError(f"{option} must be {expected}, got {value!r}")

