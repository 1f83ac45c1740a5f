"""Waiting in tests for something another thread or process does: poll a predicate until
it holds (its value is returned) and fail naming what did not happen in time; and a
clock that only moves when a test moves it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """The first true value of ``predicate()``, polled every ``interval`` seconds; an
    ``AssertionError`` naming ``what`` once ``timeout`` seconds have passed without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(interval)


class FakeClock:
    """A wall clock that only moves when told to (starts at the real time)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
