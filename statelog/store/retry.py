"""Retries with capped exponential backoff and full jitter for object-store calls.

Only :class:`~statelog.errors.TransientStoreError` is retried: timeouts, connection
resets, 5xx answers, throttling. Everything else (missing object, wrong credentials,
write-once conflicts) is final and propagates at once.

The delay before retry ``n`` (1-based) is ``uniform(0, min(max_delay, base_delay * 2**(n-1)))``
("full jitter"), so concurrent writers that failed together do not retry together.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from statelog.errors import ConfigError, TransientStoreError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a store call is retried.

    ``sleep`` and ``random`` are injectable so tests can observe the delays without
    waiting; they are excluded from equality and ``repr``.
    """

    max_attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 2.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"retry max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(
                f"retry max_attempts must be >= 1 (1 means no retry), got {self.max_attempts}"
            )
        for name in ("base_delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"retry {name} must be a number of seconds >= 0, got {value!r}")
        if self.max_delay < self.base_delay:
            raise ConfigError(
                f"retry max_delay ({self.max_delay}s) must be >= base_delay ({self.base_delay}s)"
            )

    def backoff(self, attempt: int) -> float:
        """Delay in seconds after failed attempt number ``attempt`` (1-based)."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(attempt - 1, 62)))
        return self.random() * cap

    @classmethod
    def from_value(cls, value: RetryPolicy | Mapping[str, Any] | None) -> RetryPolicy:
        """Build a policy from a store option: a policy, a dict of its fields, or ``None``."""
        if value is None:
            return cls()
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, Mapping):
            valid = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - valid)
            if unknown:
                raise ConfigError(
                    f"unknown retry option(s) {', '.join(map(str, unknown))}; "
                    f"valid ones are {', '.join(sorted(valid))}"
                )
            return cls(**dict(value))
        raise ConfigError(
            f"the 'retry' option must be a RetryPolicy or a dict of its fields, "
            f"got {type(value).__name__}"
        )


def call_with_retry(policy: RetryPolicy, fn: Callable[[], T], describe: str) -> T:
    """Call ``fn`` until it succeeds, retrying :class:`TransientStoreError` per ``policy``.

    ``describe`` names the operation in logs and errors (e.g. ``"get s3://b/p/key"``); it
    must not contain secrets. After the last attempt a :class:`TransientStoreError` is
    raised whose message carries the attempt count and the last cause.
    """
    attempt = 1
    while True:
        try:
            return fn()
        except TransientStoreError as exc:
            cause = str(exc).removeprefix(f"{describe}: ")  # the cause may name the call already
            if attempt >= policy.max_attempts:
                raise TransientStoreError(
                    f"{describe} failed after {attempt} attempt(s): {cause}", key=exc.key
                ) from exc
            delay = policy.backoff(attempt)
            logger.warning(
                "%s failed (attempt %d of %d): %s; retrying in %.3fs",
                describe,
                attempt,
                policy.max_attempts,
                cause,
                delay,
            )
            policy.sleep(delay)
            attempt += 1
