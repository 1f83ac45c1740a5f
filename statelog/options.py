"""Valid ranges of every duration, size, count and name option, and the option objects, in one place.

The library (``statelog.open`` / the changelog writer, the materializer daemon, the runtime's
``StreamExecutionEnvironment``) and the ``statelog`` CLI check their options here, so that an
option means the same and has the same range everywhere (the tables in ``docs/cli.md``,
``docs/materializer.md`` and ``docs/runtime.md`` list them). A value outside its range is a
:class:`~statelog.errors.ConfigError` that names the option, the range and the value; the
CLI prints it as one line and exits 2.

* :class:`Duration`: seconds, from a number or (CLI) a text ``"500ms"``, ``"30s"``,
  ``"10m"``, ``"1h"``, ``"2d"`` or plain seconds (:func:`parse_duration`);
* :class:`Size`: bytes, from an int or (CLI) a text ``"256MB"``, ``"1GiB"``, ``"64k"`` or
  plain bytes, binary units (:func:`parse_size`);
* :class:`Count`: a whole number in a range (from an int or a text of digits);
* :func:`non_empty_name`: a name (owner of a lease, ...) that is not empty or blank and
  holds no control character;
* :func:`parse_checkpoint_ref`: the one parser of checkpoint references ``latest``, an id,
  ``savepoint:NAME`` (and ``none`` where a fresh start is allowed);
* option objects: :class:`Options`, the base of the frozen dataclasses that hold a group of
  options with each one's default, doc and check (:class:`WriterOptions` here,
  ``materializer.options.MaterializerOptions``); ``from_mapping`` refuses unknown names.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from statelog.changelog.format import Codec
from statelog.errors import ConfigError
from statelog.store.retry import RetryPolicy

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
        return "; " + _HINTS[self.name] if self.name in _HINTS and value < self.min_s else ""


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


# -- the options and their ranges ----------------------------------------------------------------

# materializer daemon (materializer/daemon.py; `statelog materializer run`, docs/materializer.md)
MATERIALIZE_INTERVAL = Duration("interval_s", MS, 30 * DAY)
MAX_TAIL_BYTES = Size("max_tail_bytes", 1, 1 << 50)
LEASE_TTL = Duration("lease_ttl_s", 1.0, DAY)
GC_GRACE = Duration("gc_grace_s", 0.0, 365 * DAY)
GC_INTERVAL = Duration("gc_interval_s", MS, 30 * DAY)
POLL = Duration("poll_s", MS, HOUR)
RETAIN = Count("retain_checkpoints", 1, 1_000_000)

# changelog writer (statelog/changelog/writer.py; writer_options of statelog.open and the runtime)
PERSIST_DELAY = Duration("persist_delay", 0.0, DAY)
FLUSH_RECORDS = Count("flush_records", 1, 1 << 30)
MAX_BUFFERED_RECORDS = Count("max_buffered_records", 1, 1 << 32)
MAX_INFLIGHT_BYTES = Size("max_inflight_bytes", 1, 1 << 40)
STATE_MEMORY = Size("state_memory", 1 << 20, 1 << 44)
STATE_STORES = ("memory", "disk")
DEFAULT_STATE_MEMORY = 512 << 20


def check_state_store(label: str, value: Any) -> str:
    """``"memory"`` (Python dicts) or ``"disk"`` (statelog/state/tables/disk/)."""
    if value not in STATE_STORES:
        raise ConfigError(
            f"{label} must be 'memory' (keyed state in Python dicts) or 'disk' (on local disk under "
            f"a cache of state_memory bytes), got {value!r}"
        )
    return value


def check_state_dir(label: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ConfigError(f"{label} must be a local directory path, got {value!r}")
    return os.fspath(value)
UPLOAD_THREADS = Count("upload_threads", 1, 64)
ENCODE_BATCH_RECORDS = Count("encode_batch_records", 1, 1 << 24)
COMPRESSION_LEVEL = Count("compression_level", -7, 22)  # zstd's levels (negative: faster)
WRITER_LEASE_TTL = Duration("writer_lease_ttl_s", 0.05, HOUR)

# the runtime (runtime/api/environment.py StreamExecutionEnvironment, docs/runtime.md)
CHECKPOINT_INTERVAL = Duration("checkpoint_interval_s", 10 * MS, DAY)
CHECKPOINT_TIMEOUT = Duration("checkpoint_timeout_s", 1 * MS, DAY)
TOLERABLE_FAILED_CHECKPOINTS = Count("tolerable_failed_checkpoints", 0, 1_000_000)
BATCH_SIZE = Count("batch_size", 1, 1 << 20)
CHANNEL_CAPACITY = Count("channel_capacity", 1, 1 << 16)
BUFFER_DEBLOAT_TARGET = Duration("buffer_debloat_target", 1 * MS, 60.0)
MAX_INFLIGHT_BYTES = Size("max_inflight_bytes", 1, 1 << 40)

_HINTS = {
    "lease_ttl_s": "the holder renews every third of the ttl, so a shorter one only floods the store "
    "with lease writes and leaves no time to materialize",
}


# -- option objects ------------------------------------------------------------------------------
#
# A group of options (the changelog writer's, the materializer daemon's) is a frozen dataclass
# whose fields carry their default, their one-line doc and their check (a range above or a
# function); ``from_mapping`` is the one place an unknown name is refused. The library, the
# runtime and the CLI all build the same objects, so a new field is accepted everywhere.

Check = Callable[[str, Any], Any]  # (label, value) -> the checked value, or ConfigError


def option(default: Any, doc: str, check: Duration | Size | Count | Check | None = None, **meta: Any) -> Any:
    """A field of an option object: ``default``, a one-line ``doc`` and a ``check`` (a range
    object, or a function ``(label, value) -> value``); ``meta`` is kept for the CLI (e.g.
    ``flag="--interval"``). A field whose default is ``None`` also accepts ``None``."""
    return field(default=default, metadata={"doc": doc, "check": check, **meta})


def check_bool(label: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{label} must be True or False, got {value!r}")
    return value


def check_optional_bool(label: str, value: Any) -> bool | None:
    return None if value is None else check_bool(label, value)


def check_codec(label: str, value: Any) -> Codec:
    try:
        return Codec(value.value if isinstance(value, Codec) else value)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{label} must be one of {', '.join(c.value for c in Codec)} (changelog block codec), got {value!r}"
        ) from None


def check_retry(label: str, value: Any) -> RetryPolicy:
    if not isinstance(value, RetryPolicy):
        raise ConfigError(f"{label} must be a statelog.store.retry.RetryPolicy, got {type(value).__name__}")
    return value


_O = TypeVar("_O", bound="Options")


class Options:
    """Base of the frozen option dataclasses (``WriterOptions``, ``MaterializerOptions``)."""

    KIND: ClassVar[str] = "option"  # how errors name one of these options

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if not (value is None and f.default is None):
                object.__setattr__(self, f.name, self.check_field(f.name, value))

    @classmethod
    def check_field(cls, name: str, value: Any, label: str | None = None) -> Any:
        """``value`` of field ``name`` checked (a text like ``"30s"`` converted); ``label``
        names it in the error (default: ``"<KIND> <name>"``; the CLI passes its flag)."""
        check = cls.field_map()[name].metadata.get("check")
        label = label or f"{cls.KIND} {name}"
        if check is None:
            return value
        if isinstance(check, Duration | Size | Count):
            return check.check(value, label)
        return check(label, value)

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


@dataclass(frozen=True)
class WriterOptions(Options):
    """The process-wide changelog writer's options (:class:`statelog.changelog.writer.ChangelogWriter`;
    ``writer_options`` of ``statelog.open`` and of the runtime; ``docs/architecture.md``)."""

    KIND: ClassVar[str] = "changelog writer option"

    persist_delay: float = option(0.25, "seconds a change may wait in memory before a flush uploads it",
                                  PERSIST_DELAY)
    flush_records: int = option(50_000, "a flush starts as soon as this many records are buffered",
                                FLUSH_RECORDS)
    max_buffered_records: int = option(500_000, "tasks block (back-pressure) above this many buffered records",
                                       MAX_BUFFERED_RECORDS)
    max_inflight_bytes: int = option(64 << 20, "flushes wait while this many bytes are being uploaded",
                                     MAX_INFLIGHT_BYTES)
    upload_threads: int = option(2, "segment uploads running at once", UPLOAD_THREADS)
    coalesce: bool = option(False, "keep only the last change per key and state within one flush", check_bool)
    compression_level: int = option(1, "zstd level of the blocks", COMPRESSION_LEVEL)
    compression: Codec = option(Codec.ZSTD, "block codec: zstd, lz4 or none (readers accept every one)",
                                check_codec)
    retry: RetryPolicy = option(RetryPolicy(), "retries of a failed segment upload", check_retry)
    encode_in_task: bool = option(True, "tasks convert their own full batches to Arrow (else the flusher does)",
                                  check_bool)
    encode_batch_records: int = option(4096, "records per batch a task converts at once", ENCODE_BATCH_RECORDS)
    columnar: bool | None = option(None, "columnar record buffers for narrow streams (None: when the C "
                                   "extension is built and STATELOG_PURE_PYTHON is unset)", check_optional_bool)
