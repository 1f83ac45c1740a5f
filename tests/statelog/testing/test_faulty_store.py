from __future__ import annotations

import time
from pathlib import Path

import pytest

from statelog.errors import ConfigError, ObjectNotFoundError, StoreError, TransientStoreError
from statelog.store import RetryPolicy, call_with_retry
from statelog.store.local import LocalObjectStore
from statelog.testing import FaultInjectingStore
from tests.support.s3server import RootSpec

pytestmark = pytest.mark.fault


class Crash(Exception):
    """Stands in for the process dying at a chosen instruction."""


@pytest.fixture
def inner(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "root")


@pytest.fixture
def store(inner: LocalObjectStore) -> FaultInjectingStore:
    return FaultInjectingStore(inner, seed=1)


def test_passes_everything_through_by_default(store: FaultInjectingStore) -> None:
    store.put("a/b", b"data")
    assert store.get("a/b") == b"data"
    assert store.get_range("a/b", 1, 2) == b"at"
    assert store.head("a/b") is not None and store.exists("a/b")
    assert [i.key for i in store.list("a/")] == ["a/b"]
    store.delete("a/b")
    assert store.head("a/b") is None
    assert store.url == store.inner.url
    assert store.calls["head"] == 3 and store.injected == {}


def test_fail_next_n_then_recover(store: FaultInjectingStore) -> None:
    store.fail_next("put", 2)
    for _ in range(2):
        with pytest.raises(TransientStoreError, match="injected put failure for 'k'"):
            store.put("k", b"v")
    store.put("k", b"v")
    assert store.injected["put"] == 2 and store.calls["put"] == 3


def test_retry_rides_over_injected_transient_failures(store: FaultInjectingStore) -> None:
    store.fail_next("get", 3)
    store.put("k", b"v")
    sleeps: list[float] = []
    policy = RetryPolicy(max_attempts=5, sleep=sleeps.append)
    assert call_with_retry(policy, lambda: store.get("k"), "get k") == b"v"
    assert len(sleeps) == 3


def test_error_kinds(store: FaultInjectingStore) -> None:
    store.put("k", b"v")
    store.fail_next("get", 1, error=ObjectNotFoundError)
    with pytest.raises(ObjectNotFoundError, match="injected get failure"):
        store.get("k")
    boom = StoreError("disk on fire", key="k")
    store.fail_next("get", 1, error=boom)
    with pytest.raises(StoreError) as info:
        store.get("k")
    assert info.value is boom
    store.fail_next("get", 1, error=lambda op, key: TimeoutError(f"{op}:{key}"))
    with pytest.raises(TimeoutError, match="get:k"):
        store.get("k")
    assert store.get("k") == b"v"


def test_key_prefix_and_wildcard(store: FaultInjectingStore) -> None:
    store.fail_next("*", 2, key_prefix="changelog/")
    store.put("meta/1", b"m")  # not matching
    with pytest.raises(TransientStoreError):
        store.put("changelog/1", b"c")
    with pytest.raises(TransientStoreError):
        store.head("changelog/1")
    store.put("changelog/1", b"c")


def test_fail_randomly_is_reproducible(tmp_path: Path) -> None:
    def outcomes(seed: int) -> list[bool]:
        store = FaultInjectingStore(LocalObjectStore(tmp_path / f"s{seed}"), seed=seed)
        store.put("k", b"v")
        store.fail_randomly("get", 0.5)
        result = []
        for _ in range(64):
            try:
                store.get("k")
                result.append(True)
            except TransientStoreError:
                result.append(False)
        return result

    first = outcomes(7)
    assert first == outcomes(7)
    assert 10 < first.count(False) < 54
    with pytest.raises(ConfigError):
        FaultInjectingStore(LocalObjectStore(tmp_path)).fail_randomly("get", 1.5)


def test_crash_before_put_stores_nothing(store: FaultInjectingStore) -> None:
    def crash(op: str, key: str) -> None:
        raise Crash(f"{op} {key}")

    store.before("put", crash)
    with pytest.raises(Crash, match="put k"):
        store.put("k", b"v")
    assert store.inner.head("k") is None
    store.before("put", None)
    store.put("k", b"v")


def test_crash_after_put_leaves_a_durable_object(store: FaultInjectingStore) -> None:
    def crash(op: str, key: str) -> None:
        raise Crash(key)

    store.after("put", crash)
    with pytest.raises(Crash):
        store.put("k", b"v")
    assert store.inner.get("k") == b"v"
    store.after("put", None)
    store.put("k", b"v")  # the retry after restart is an idempotent no-op


def test_corrupt_reads_flip_exactly_one_byte(store: FaultInjectingStore) -> None:
    data = bytes(range(256))
    store.put("seg/1", data)
    store.put("meta/1", data)
    store.corrupt_reads(key_prefix="seg/")
    got = store.get("seg/1")
    assert len(got) == len(data)
    assert sum(a != b for a, b in zip(got, data, strict=True)) == 1
    ranged = store.get_range("seg/1", -16, 16)
    assert sum(a != b for a, b in zip(ranged, data[-16:], strict=True)) == 1
    assert store.get("meta/1") == data
    assert store.inner.get("seg/1") == data  # only the bytes returned are corrupt


def test_corrupting_an_empty_object_returns_it_unchanged(store: FaultInjectingStore) -> None:
    store.put("e", b"")
    store.corrupt_reads()
    assert store.get("e") == b""


def test_latency(store: FaultInjectingStore) -> None:
    store.put("k", b"v")
    store.add_latency("get", 0.05)
    started = time.monotonic()
    assert store.get("k") == b"v"
    assert time.monotonic() - started >= 0.05  # the injected latency was added to the get


def test_reset_and_validation(store: FaultInjectingStore) -> None:
    store.fail_next("put", 5)
    store.corrupt_reads()
    store.reset()
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert store.calls == {"put": 1, "get": 1}
    with pytest.raises(ConfigError, match="unknown store operation 'write'"):
        store.fail_next("write")


@pytest.mark.s3
def test_wraps_the_s3_store_too(s3_root: RootSpec) -> None:
    store = FaultInjectingStore(s3_root.open(), seed=3)
    store.fail_next("put", 1)
    with pytest.raises(TransientStoreError):
        store.put("k", b"v")
    store.put("k", b"v")
    store.corrupt_reads()
    assert store.get("k") != b"v"
    assert repr(store).startswith("FaultInjectingStore(S3ObjectStore(")
