"""The options of :class:`~runtime.app.application.Application`, checked like every option object.

:class:`ApplicationOptions` is a frozen :class:`~statelog.options.base.Options` dataclass: each
field has its default, a one-line doc and its check, and an unknown name is refused by
:meth:`~statelog.options.base.Options.from_mapping`. ``docs/guide.md`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from materializer.options import MaterializerOptions
from statelog.errors import ConfigError
from statelog.options.base import Options, check_bool, option
from statelog.options.values import (
    DAY,
    MS,
    Count,
    Duration,
    check_port,
    non_empty_name,
    parse_checkpoint_ref,
)
from statelog.store.local_copies import local_copies_setting

# how the application sets the current key of a record (the ``key`` option)
KEY_STR = "str"  # msg.key() decoded as UTF-8 text
KEY_BYTES = "bytes"  # msg.key() as it is
KEY_MODES = (KEY_STR, KEY_BYTES)

BATCH_SIZE = Count("batch_size", 1, 1_000_000)  # librdkafka's most messages per consume()
POLL_TIMEOUT = Duration("poll_timeout_s", MS, 60.0)
CHECKPOINT_EVERY = Count("checkpoint_every", 1, 1 << 40)
CHECKPOINT_INTERVAL = Duration("checkpoint_interval_s", 10 * MS, DAY)
CHECKPOINT_TIMEOUT = Duration("checkpoint_timeout_s", MS, DAY)

_SECRET_WORDS = ("password", "secret", "token", "key")


class KafkaSettings(dict[str, Any]):
    """The consumer's settings; ``repr`` shows ``***`` for secrets (passwords, tokens, keys)."""

    def __repr__(self) -> str:
        shown = {k: "***" if any(w in k.lower() for w in _SECRET_WORDS) else v for k, v in self.items()}
        return f"KafkaSettings({shown!r})"


def check_topics(label: str, value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else None
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ConfigError(f"{label} must be a topic name or a non-empty list of topic names, got {value!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{label} names a topic twice: {value!r}")
    return tuple(names)


def check_kafka(label: str, value: Any) -> KafkaSettings:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{label} must be the Kafka consumer's settings, a dict such as "
            f"{{'bootstrap.servers': 'broker:9092'}}, got {type(value).__name__}"
        )
    servers = value.get("bootstrap.servers")
    if not isinstance(servers, str) or not servers.strip():
        raise ConfigError(f"{label} must name the brokers: 'bootstrap.servers' is missing or empty")
    if value.get("enable.auto.commit") not in (None, False, "false"):
        raise ConfigError(
            f"{label}: enable.auto.commit must stay false: the application's checkpoints hold the "
            "offsets (commit_offsets=True commits them to the group after each checkpoint)"
        )
    return KafkaSettings(value)


def check_key(label: str, value: Any) -> str | Callable[[Any], Any]:
    if value in KEY_MODES or callable(value):
        return value
    raise ConfigError(
        f"{label} must be 'str' (the message key as UTF-8 text), 'bytes' (the message key as it is), "
        f"a function message -> key, or None (your function sets the key), got {value!r}"
    )


def check_restore(label: str, value: Any) -> int | str:
    parse_checkpoint_ref(value, label, allow_none=True)
    return value


def check_start(label: str, value: Any) -> str | int:
    if value in ("earliest", "latest") or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ConfigError(f"{label} must be 'earliest', 'latest' or a timestamp in milliseconds (int >= 0), "
                      f"got {value!r}")


def check_partitions(label: str, value: Any) -> dict[str, list[int]]:
    ok = isinstance(value, Mapping) and all(
        isinstance(parts, list | tuple) and all(isinstance(p, int) and not isinstance(p, bool) for p in parts)
        for parts in value.values()
    )
    if not ok:
        raise ConfigError(f"{label} must be a dict {{topic: [partition, ...]}}, got {value!r}")
    return {t: list(parts) for t, parts in value.items()}


def check_materializer(label: str, value: Any) -> bool | MaterializerOptions:
    if isinstance(value, bool):
        return value
    if isinstance(value, Mapping | MaterializerOptions):
        return MaterializerOptions.from_mapping(value)
    raise ConfigError(
        f"{label} must be True (a background materializer), False (a daemon runs elsewhere) or "
        f"the materializer's options (a dict or a MaterializerOptions), got {value!r}"
    )


def check_open_options(label: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{label} must be a dict of statelog.open keyword arguments, got {type(value).__name__}")
    return dict(value)


def _check_host(label: str, value: Any) -> str:
    return non_empty_name(label, value)


def _check_uid(label: str, value: Any) -> str:
    return non_empty_name(label, value)


@dataclass(frozen=True)
class ApplicationOptions(Options):
    """Every option of an :class:`~runtime.app.application.Application` (``docs/guide.md``)."""

    KIND: ClassVar[str] = "application option"

    topics: tuple[str, ...] | None = option(None, "the topic(s) the application reads (required)", check_topics)
    kafka: KafkaSettings | None = option(None, "the Kafka consumer's settings, with bootstrap.servers (required)",
                                         check_kafka)
    uid: str = option("app", "the operator uid of the application's keyed state", _check_uid)
    key: str | Callable[[Any], Any] | None = option(
        KEY_STR, "how each record's key is set: 'str', 'bytes', a function message -> key, or None "
        "(your function sets it)", check_key, none_ok=True)
    batch_size: int = option(500, "most messages per Kafka consume() call", BATCH_SIZE)
    poll_timeout_s: float = option(0.5, "how long one consume() waits for messages", POLL_TIMEOUT)
    checkpoint_every: int | None = option(10_000, "checkpoint after this many records (None: by time only)",
                                          CHECKPOINT_EVERY, none_ok=True)
    checkpoint_interval_s: float | None = option(5.0, "checkpoint after this many seconds (None: by count "
                                                 "only)", CHECKPOINT_INTERVAL, none_ok=True)
    checkpoint_timeout_s: float = option(60.0, "a checkpoint not durable after this long fails",
                                         CHECKPOINT_TIMEOUT)
    restore: int | str = option("latest", "the checkpoint to start from: 'latest', an id, 'savepoint:NAME' "
                                "or 'none'", check_restore)
    start: str | int = option("earliest", "where a partition no checkpoint names starts: 'earliest', "
                              "'latest' or a timestamp in ms", check_start)
    partitions: dict[str, list[int]] | None = option(None, "{topic: [partition, ...]} this process reads "
                                                     "(None: every partition)", check_partitions)
    commit_offsets: bool = option(True, "commit the checkpointed offsets to the consumer group (for lag "
                                  "monitors only)", check_bool)
    materializer: bool | MaterializerOptions = option(True, "run the materializer in a background thread "
                                                      "(or its options; False: a daemon runs elsewhere)",
                                                      check_materializer)
    handle_signals: bool = option(True, "SIGINT and SIGTERM stop the application with a final checkpoint",
                                  check_bool)
    open_options: dict[str, Any] | None = option(None, "keyword arguments of statelog.open when the "
                                                 "application opens the root", check_open_options)
    local_copies: bool | dict[str, Any] | None = option(True, "keep local copies of the segments, tables and "
                                                        "manifests this process writes or reads and restore from "
                                                        "them first: True (the default: $XDG_CACHE_HOME/statelog/"
                                                        "copies, 1 GiB), a directory or a dict with directory and "
                                                        "budget_bytes (statelog.open's local_copies); False: off",
                                                        lambda label, v: local_copies_setting(v, label),
                                                        none_ok=True)
    metrics_port: int | None = option(None, "serve Prometheus metrics on this port (0: any free one; "
                                      "None: off); the address is app.job.metrics.url", check_port,
                                      none_ok=True)
    metrics_host: str = option("127.0.0.1", "the address the metrics server listens on", _check_host)
    standby: bool = option(False, "a hot standby: follow the root until its writer lease is free, then take "
                           "over from the replica without a restore (docs/follow.md)", check_bool)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.topics is None:
            raise ConfigError(f"{self.label('topics')} is required: the topic or topics to read, e.g. "
                              "topics='clicks'")
        if self.kafka is None:
            raise ConfigError(f"{self.label('kafka')} is required: the consumer's settings, e.g. "
                              "kafka={'bootstrap.servers': 'broker:9092'}")
        if self.checkpoint_every is None and self.checkpoint_interval_s is None:
            raise ConfigError(
                "checkpoint_every and checkpoint_interval_s are both None: the application would "
                "checkpoint only when it stops; set at least one of them"
            )
        if self.open_options and {"metrics_port", "metrics_host"} & self.open_options.keys():
            raise ConfigError("set metrics_port and metrics_host as options of the Application, not in open_options")
        if self.open_options and "local_copies" in self.open_options:
            raise ConfigError("set local_copies as an option of the Application, not in open_options")
        if self.open_options and "standby" in self.open_options:
            raise ConfigError("set standby as an option of the Application, not in open_options")
        for topic in self.partitions or {}:
            if topic not in self.topics:
                raise ConfigError(f"{self.label('partitions')} names topic {topic!r}, which is not in "
                                  f"topics {list(self.topics)}")
