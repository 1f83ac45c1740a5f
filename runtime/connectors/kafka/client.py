"""The confluent-kafka client as the Kafka source and sink use it: the import (the ``kafka``
extra), client calls whose failures say what failed, the cluster's metadata, settings.

Both the source and the sink list the cluster's topics when they open (:func:`list_topics`:
their ``metadata_timeout_s``, default :data:`METADATA_TIMEOUT_S`, "is the broker reachable?"). Client calls that may serve
callbacks go through :func:`kafka_call`, which reports a fatal producer error as itself
rather than the ``SystemError`` confluent-kafka raises for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

try:  # the kafka extra; the runtime imports without it
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401 - confluent_kafka.admin.AdminClient
except ImportError:  # pragma: no cover - exercised only without the extra
    confluent_kafka = None

from runtime.errors import JobGraphError, RuntimeJobError

# settings a consumer made from a producer's settings must not get
PRODUCER_ONLY = ("linger.ms", "enable.idempotence", "transactional.id", "acks", "compression.type")
_SECRET_WORDS = ("password", "secret", "token", "key")
# how long the source and the sink wait for the cluster's metadata before they call the
# bootstrap address unreachable (the default of their metadata_timeout_s)
METADATA_TIMEOUT_S = 10.0


class KafkaError(RuntimeJobError):
    """A Kafka source or sink failed (the message names the topic and what to do)."""


def require_kafka() -> Any:
    """The ``confluent_kafka`` module; a :class:`JobGraphError` naming the extra without it."""
    if confluent_kafka is None:
        raise JobGraphError("the Kafka source and sink need confluent-kafka: pip install 'statelog[kafka]'")
    return confluent_kafka


def check_metadata_timeout(who: str, value: Any) -> float:
    """A source's or sink's ``metadata_timeout_s``: seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise JobGraphError(f"{who} metadata_timeout_s must be a number of seconds > 0, got {value!r}")
    return float(value)


def list_topics(client: Any, bootstrap_servers: str, who: str, timeout: float = METADATA_TIMEOUT_S) -> Any:
    """The cluster's metadata by ``client``; a :class:`KafkaError` naming the bootstrap
    address when it does not answer within ``timeout`` seconds."""
    try:
        return client.list_topics(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - KafkaException, or a closed client
        del client  # the traceback keeps this frame: a client made for the check goes now
        raise KafkaError(
            f"{who} could not list the topics of {bootstrap_servers} ({e}); is the broker reachable?"
        ) from None


def _describe(exc: BaseException) -> str:
    """A client exception in words; a fatal producer error says what it means."""
    err = exc.args[0] if exc.args else None
    return describe_kafka_error(err if err is not None else exc)


FATAL_MEANING = (" (a fatal producer error: this producer cannot go on, e.g. the broker lost its idempotence"
                 " state in a restart; the attempt fails and the next one starts new producers)")


def describe_kafka_error(err: Any) -> str:
    """A client error (a confluent-kafka ``KafkaError``) in words; a fatal producer error says
    what it means."""
    text = str(err)
    if getattr(err, "fatal", None) is not None and err.fatal():
        text += FATAL_MEANING
    return text


def kafka_call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a confluent-kafka call that may serve callbacks (poll, flush,
    transactions), with its failure as a :class:`KafkaError` saying ``what`` failed.

    After a fatal producer error confluent-kafka's error callback leaves the fatal
    ``KafkaException`` set while it goes on calling delivery callbacks, so the call raises
    ``SystemError: ... returned a result with an exception set`` from it: this reports the
    fatal error itself."""
    ck = require_kafka()
    try:
        return fn(*args, **kwargs)
    except SystemError as e:
        cause = e.__cause__ if e.__cause__ is not None else e.__context__
        if not isinstance(cause, ck.KafkaException):
            raise
        raise KafkaError(f"{what} failed: {_describe(cause)}") from None
    except ck.KafkaException as e:
        raise KafkaError(f"{what} failed: {_describe(e)}") from None


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secret values (passwords, keys, tokens) replaced, for logs and errors."""
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in config.items()}


def check_config(what: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise JobGraphError(f"{what} must be a dict of librdkafka settings, got {type(config).__name__}")
    return dict(config)
