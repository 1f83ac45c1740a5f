"""Restart strategies: whether and after which delay a failed job is restarted.

They follow Flink's: ``FixedDelay`` (a number of attempts with a constant delay),
``ExponentialBackoff`` (a growing delay, reset after a stable period) and ``FailureRate``
(give up when too many failures fall in a time window). The job master asks
:meth:`RestartStrategy.next_delay` at every failure; ``None`` means "fail the job".
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from runtime.errors import JobGraphError


class RestartStrategy:
    """Decides after each failure whether to restart and after which delay (seconds)."""

    def next_delay(self, now: float | None = None) -> float | None:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclass
class NoRestart(RestartStrategy):
    def next_delay(self, now: float | None = None) -> float | None:
        return None


@dataclass
class FixedDelay(RestartStrategy):
    """At most ``attempts`` restarts, each after ``delay_s``."""

    attempts: int = 3
    delay_s: float = 1.0
    _used: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 0:
            raise JobGraphError(f"FixedDelay.attempts must be an int >= 0, got {self.attempts!r}")
        _check_delay("FixedDelay.delay_s", self.delay_s)

    def next_delay(self, now: float | None = None) -> float | None:
        if self._used >= self.attempts:
            return None
        self._used += 1
        return self.delay_s

    def describe(self) -> str:
        return f"FixedDelay(attempts={self.attempts}, delay_s={self.delay_s})"


@dataclass
class ExponentialBackoff(RestartStrategy):
    """Delays ``initial_s * multiplier**n`` capped at ``max_s``; ``n`` resets to 0 when the job
    ran ``reset_after_s`` without failure. ``max_attempts`` (``None``: unlimited) bounds the
    total number of restarts."""

    initial_s: float = 0.1
    max_s: float = 10.0
    multiplier: float = 2.0
    reset_after_s: float = 60.0
    max_attempts: int | None = None
    _n: int = field(default=0, init=False, repr=False)
    _used: int = field(default=0, init=False, repr=False)
    _last: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_delay("ExponentialBackoff.initial_s", self.initial_s)
        _check_delay("ExponentialBackoff.max_s", self.max_s)
        if self.multiplier < 1:
            raise JobGraphError(f"ExponentialBackoff.multiplier must be >= 1, got {self.multiplier!r}")

    def next_delay(self, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        if self.max_attempts is not None and self._used >= self.max_attempts:
            return None
        if self._last is not None and now - self._last >= self.reset_after_s:
            self._n = 0
        delay = min(self.max_s, self.initial_s * self.multiplier**self._n)
        self._n += 1
        self._used += 1
        self._last = now
        return delay

    def describe(self) -> str:
        return f"ExponentialBackoff(initial_s={self.initial_s}, max_s={self.max_s})"


@dataclass
class FailureRate(RestartStrategy):
    """Restart after ``delay_s`` unless more than ``max_failures`` failures fell within the last
    ``interval_s`` seconds."""

    max_failures: int = 3
    interval_s: float = 60.0
    delay_s: float = 1.0
    _times: deque[float] = field(default_factory=deque, init=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.max_failures) is not int or self.max_failures < 0:
            raise JobGraphError(f"FailureRate.max_failures must be an int >= 0, got {self.max_failures!r}")
        _check_delay("FailureRate.delay_s", self.delay_s)

    def next_delay(self, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        self._times.append(now)
        while self._times and now - self._times[0] > self.interval_s:
            self._times.popleft()
        if len(self._times) > self.max_failures:
            return None
        return self.delay_s

    def describe(self) -> str:
        return f"FailureRate(max_failures={self.max_failures}, interval_s={self.interval_s})"


def _check_delay(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise JobGraphError(f"{name} must be a number of seconds >= 0, got {value!r}")
