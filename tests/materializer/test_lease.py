"""The materializer's leader lease: one holder per job root, fencing generations, takeover."""

from __future__ import annotations

import threading

import pytest

from materializer.lease import (
    LEASE_PREFIX,
    LeaderLease,
    current_holder,
    generation_key,
    released_key,
    renewal_key,
)
from statelog.errors import ConfigError, CorruptionError, LeaseLostError, TransientStoreError
from statelog.store import ObjectStore
from statelog.testing import FaultInjectingStore
from tests.support.s3server import RootSpec

TTL = 30.0


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def keys(store: ObjectStore) -> list[str]:
    return [info.key[len(LEASE_PREFIX) :] for info in store.list(LEASE_PREFIX)]


def test_first_daemon_acquires_generation_1(store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        assert current_holder(store) is None
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        assert a.generation is None and not a.is_valid()
        assert a.try_acquire() is True
        assert a.generation == 1 and a.is_valid(margin_s=5)
        assert a.ensure_valid() == 1
        holder = current_holder(store)
        assert holder is not None
        assert holder["generation"] == 1 and holder["owner"] == "daemon-a"
        assert holder["instance"] == a.instance and holder["ttl_ms"] == 30_000
        assert holder["released"] is False and holder["renewals"] == 0
        assert keys(store) == ["gen-000000000001.json"]


def test_only_one_of_two_daemons_acquires_while_renewed(store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True
        for _ in range(8):  # 80 s, far beyond one ttl, renewed every 10 s
            assert b.try_acquire() is False
            clock.advance(10)
            assert a.renew() is True
        assert b.try_acquire() is False and b.generation is None
        assert a.generation == 1 and a.is_valid(margin_s=15)
        # one renewal object is kept per generation (the older ones are deleted)
        assert keys(store) == ["gen-000000000001.json", "gen-000000000001.renew-000000000008.json"]
        assert current_holder(store)["renewals"] == 8  # type: ignore[index]


def test_takeover_after_expiry_fences_the_old_holder(store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True
        assert b.try_acquire() is False  # starts observing generation 1
        clock.advance(TTL - 1)
        assert b.try_acquire() is False  # not yet: unchanged for 29 s only
        clock.advance(2)
        assert b.try_acquire() is True
        assert b.generation == 2
        assert a.is_valid() is False and a.generation is None
        assert a.renew() is False
        with pytest.raises(LeaseLostError, match="expired"):
            a.ensure_valid()
        holder = current_holder(store)
        assert holder is not None and holder["generation"] == 2 and holder["owner"] == "daemon-b"


def test_higher_generation_fences_a_holder_whose_clock_says_valid(store_root: RootSpec) -> None:
    """By its own clock A is still valid; the listing shows B's higher generation."""
    clock_a, clock_b = FakeClock(), FakeClock()
    with store_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock_a)
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock_b)
        assert a.try_acquire() is True
        assert b.try_acquire() is False
        clock_b.advance(TTL + 1)  # A is paused (e.g. stopped): its clock does not move
        assert b.try_acquire() is True and b.generation == 2
        assert a.is_valid() is False
        assert a.lost_reason is not None and "generation 2" in a.lost_reason
        assert a.renew() is False
        assert b.is_valid(margin_s=10) is True


def test_release_lets_the_other_acquire_at_once(store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True
        assert b.try_acquire() is False
        a.release()
        assert a.generation is None and a.is_valid() is False
        assert current_holder(store)["released"] is True  # type: ignore[index]
        assert b.try_acquire() is True and b.generation == 2  # no waiting
        assert released_key(1)[len(LEASE_PREFIX) :] in keys(store)
        a.release()  # not held: a no-op


def test_fresh_contender_waits_a_full_ttl_even_for_an_old_lease(file_root: RootSpec) -> None:
    """Expiry never trusts timestamps: a new daemon observes for one ttl first."""
    clock_a, clock_b = FakeClock(start=0.0), FakeClock(start=10_000.0)
    with file_root.open() as store:
        assert LeaderLease(store, "crashed", ttl_s=TTL, clock=clock_a).try_acquire()
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock_b)
        assert b.try_acquire() is False
        clock_b.advance(TTL / 2)
        assert b.try_acquire() is False
        clock_b.advance(TTL / 2)
        assert b.try_acquire() is True and b.generation == 2


def test_contender_uses_the_holders_ttl(file_root: RootSpec) -> None:
    clock = FakeClock()
    with file_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=60.0, clock=clock)
        b = LeaderLease(store, "daemon-b", ttl_s=5.0, clock=clock)
        assert a.try_acquire() is True
        assert b.try_acquire() is False
        clock.advance(30)
        assert b.try_acquire() is False  # B's own ttl (5 s) is irrelevant
        assert a.is_valid(margin_s=20) is True
        clock.advance(31)
        assert b.try_acquire() is True and b.generation == 2


def test_many_contenders_race_exactly_one_wins(store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        holder = LeaderLease(store, "old", ttl_s=TTL, clock=clock)
        assert holder.try_acquire() is True
        leases = [LeaderLease(store, f"daemon-{i}", ttl_s=TTL, clock=clock) for i in range(4)]
        for lease in leases:
            assert lease.try_acquire() is False
        clock.advance(TTL + 1)
        barrier = threading.Barrier(len(leases))
        results: list[bool] = []

        def contend(lease: LeaderLease) -> None:
            barrier.wait()
            results.append(lease.try_acquire())

        threads = [threading.Thread(target=contend, args=(lease,)) for lease in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, False, False, True]
        winner = next(lease for lease in leases if lease.generation is not None)
        assert winner.generation == 2
        assert current_holder(store)["instance"] == winner.instance  # type: ignore[index]


def test_own_lapsed_generation_is_reacquired_at_once(file_root: RootSpec) -> None:
    clock = FakeClock()
    with file_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True
        clock.advance(TTL + 5)  # e.g. a long pause; nobody else contends
        assert a.renew() is False and a.generation is None
        assert a.try_acquire() is True and a.generation == 2  # new fencing token


def test_renewal_that_completes_after_the_deadline_is_lost(file_root: RootSpec) -> None:
    clock = FakeClock()
    with file_root.open() as inner:
        store = FaultInjectingStore(inner)
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True
        clock.advance(TTL - 2)
        # the renewal PUT is slow: it completes 5 s later, after the deadline
        store.before("put_if_absent", lambda op, key: clock.advance(5))
        assert a.renew() is False
        assert a.lost_reason is not None and "after the deadline" in a.lost_reason


def test_margin_and_renewal_extend_validity(file_root: RootSpec) -> None:
    clock = FakeClock()
    with file_root.open() as store:
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True
        clock.advance(25)
        assert a.is_valid(margin_s=10) is False  # would expire during a 10 s publish
        assert a.generation == 1 and a.is_valid(margin_s=1) is True  # still held
        assert a.remaining_s() == pytest.approx(5)
        with pytest.raises(LeaseLostError, match="margin"):
            a.ensure_valid(margin_s=10)
        assert a.renew() is True
        assert a.is_valid(margin_s=10) is True and a.remaining_s() == pytest.approx(TTL)
        assert a.try_acquire() is True  # held: try_acquire renews


def test_unknown_outcome_is_settled_by_reading_back(store_root: RootSpec) -> None:
    """The create lands but the caller sees an error: the lease reads its own bytes back."""
    clock = FakeClock()
    with store_root.open() as inner:
        store = FaultInjectingStore(inner)

        def lost_answer(op: str, key: str) -> None:
            raise TransientStoreError("connection reset after the request", key=key)

        store.after("put_if_absent", lost_answer)
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True and a.generation == 1
        clock.advance(10)
        assert a.renew() is True
        store.after("put_if_absent", None)
        # Store down: the outcome cannot be settled, the error propagates, the lease is
        # still held until its deadline and the next renewal uses a fresh number.
        store.fail_next("put_if_absent", 1)
        store.fail_next("get", 1)
        with pytest.raises(TransientStoreError):
            a.renew()
        assert a.generation == 1 and a.is_valid()
        assert a.renew() is True
        assert keys(inner)[-1] == renewal_key(1, 3)[len(LEASE_PREFIX) :]


def test_prune_keeps_the_newest_generation(store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        for _ in range(3):
            lease = LeaderLease(store, "cycler", ttl_s=TTL, clock=clock)
            assert lease.try_acquire() is True
            assert lease.renew() and lease.renew()
            lease.release()
        # a left-over renewal (e.g. a crash before the best-effort delete)
        store.put(renewal_key(3, 1), b"stale")
        a = LeaderLease(store, "daemon-a", ttl_s=TTL, clock=clock)
        assert a.try_acquire() is True and a.generation == 4
        assert a.renew() is True
        with pytest.raises(ConfigError):
            a.prune(keep=0)
        deleted = a.prune(keep=2)
        assert keys(store) == [
            "gen-000000000003.json",
            "gen-000000000003.released",
            "gen-000000000003.renew-000000000002.json",
            "gen-000000000004.json",
            "gen-000000000004.renew-000000000001.json",
        ]
        assert deleted == 7
        assert a.prune(keep=1) == 3
        assert keys(store) == ["gen-000000000004.json", "gen-000000000004.renew-000000000001.json"]
        assert a.is_valid()
        a.release()
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock)
        assert b.try_acquire() is True and b.generation == 5  # numbering never restarts


def test_corrupt_lease_object_fails_naming_it(file_root: RootSpec) -> None:
    clock = FakeClock()
    with file_root.open() as store:
        store.put(generation_key(1), b'{"crc32": 1, "body": {"format": "statelog-lease"}}')
        b = LeaderLease(store, "daemon-b", ttl_s=TTL, clock=clock)
        assert b.try_acquire() is False
        clock.advance(TTL + 1)
        with pytest.raises(CorruptionError, match="gen-000000000001.json"):
            b.try_acquire()
        with pytest.raises(CorruptionError, match="checksum"):
            current_holder(store)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        LeaderLease(None, "", ttl_s=TTL)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        LeaderLease(None, "x", ttl_s=0)  # type: ignore[arg-type]
