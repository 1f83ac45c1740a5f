from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from statelog.errors import ConfigError, ObjectNotFoundError, TransientStoreError
from statelog.store import RetryPolicy, call_with_retry


class Recorder:
    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def failing(times: int, error: Callable[[int], Exception] | None = None) -> Callable[[], str]:
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise (error or (lambda n: TransientStoreError(f"boom {n}", key="k")))(calls["n"])
        return f"ok after {calls['n']}"

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def test_backoff_grows_exponentially_up_to_max_delay() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=0.1, max_delay=1.0, random=lambda: 1.0)
    assert [policy.backoff(n) for n in range(1, 8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    )


def test_backoff_is_full_jitter() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0, random=lambda: 0.25)
    assert policy.backoff(3) == pytest.approx(0.25 * 0.4)
    assert RetryPolicy(random=lambda: 0.0).backoff(5) == 0.0


def test_backoff_with_real_random_stays_within_bounds() -> None:
    policy = RetryPolicy(base_delay=0.05, max_delay=0.3)
    delays = [policy.backoff(n) for n in range(1, 20) for _ in range(20)]
    assert all(0.0 <= d <= 0.3 for d in delays)
    assert len(set(delays)) > 100  # jittered, not a fixed schedule


def test_backoff_huge_attempt_number_does_not_overflow() -> None:
    assert RetryPolicy(random=lambda: 1.0).backoff(10_000) == 2.0


def test_succeeds_after_transient_failures_with_growing_delays() -> None:
    rec = Recorder()
    policy = RetryPolicy(
        max_attempts=6, base_delay=0.05, max_delay=2.0, sleep=rec.sleep, random=lambda: 1.0
    )
    fn = failing(3)
    assert call_with_retry(policy, fn, "get file:///x/k") == "ok after 4"
    assert rec.sleeps == pytest.approx([0.05, 0.1, 0.2])


def test_gives_up_after_max_attempts_with_count_in_message() -> None:
    rec = Recorder()
    policy = RetryPolicy(max_attempts=4, sleep=rec.sleep, random=lambda: 0.5)
    fn = failing(100)
    with pytest.raises(TransientStoreError) as info:
        call_with_retry(policy, fn, "put s3://b/p/k")
    assert "put s3://b/p/k failed after 4 attempt(s)" in str(info.value)
    assert "boom 4" in str(info.value)  # the last cause
    assert isinstance(info.value.__cause__, TransientStoreError)
    assert info.value.key == "k"
    assert fn.calls["n"] == 4  # type: ignore[attr-defined]
    assert len(rec.sleeps) == 3  # no sleep after the last attempt


def test_max_attempts_one_means_no_retry() -> None:
    rec = Recorder()
    fn = failing(1)
    with pytest.raises(TransientStoreError, match="after 1 attempt"):
        call_with_retry(RetryPolicy(max_attempts=1, sleep=rec.sleep), fn, "op")
    assert rec.sleeps == []


def test_non_transient_errors_are_not_retried() -> None:
    rec = Recorder()
    fn = failing(5, lambda n: ObjectNotFoundError("gone", key="k"))
    with pytest.raises(ObjectNotFoundError, match="gone"):
        call_with_retry(RetryPolicy(sleep=rec.sleep), fn, "get")
    assert fn.calls["n"] == 1  # type: ignore[attr-defined]
    assert rec.sleeps == []


def test_other_exceptions_are_not_retried() -> None:
    fn = failing(5, lambda n: KeyError("bug"))
    with pytest.raises(KeyError):
        call_with_retry(RetryPolicy(sleep=Recorder().sleep), fn, "get")
    assert fn.calls["n"] == 1  # type: ignore[attr-defined]


def test_retries_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    policy = RetryPolicy(sleep=Recorder().sleep, random=lambda: 1.0)
    with caplog.at_level(logging.WARNING, logger="statelog.store.retry"):
        call_with_retry(policy, failing(2), "head s3://b/p/k")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "head s3://b/p/k failed (attempt 1 of 6)" in messages[0]
    assert "retrying in 0.050s" in messages[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"base_delay": -1},
        {"max_delay": "2"},
        {"base_delay": 3.0, "max_delay": 1.0},
    ],
)
def test_policy_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_from_value() -> None:
    assert RetryPolicy.from_value(None) == RetryPolicy()
    policy = RetryPolicy(max_attempts=2)
    assert RetryPolicy.from_value(policy) is policy
    assert RetryPolicy.from_value({"max_attempts": 3, "max_delay": 0.5}) == RetryPolicy(
        max_attempts=3, max_delay=0.5
    )
    with pytest.raises(ConfigError, match="unknown retry option.*attempts.*valid ones"):
        RetryPolicy.from_value({"attempts": 3})
    with pytest.raises(ConfigError, match="RetryPolicy or a dict"):
        RetryPolicy.from_value(3)  # type: ignore[arg-type]


def test_policy_is_frozen_and_repr_hides_callables() -> None:
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.max_attempts = 3  # type: ignore[misc]
    assert repr(policy) == "RetryPolicy(max_attempts=6, base_delay=0.05, max_delay=2.0)"
