"""The materializer daemon: triggers, leader lease and fencing, shutdown, background mode, CLI.

In-process daemons run single cycles (``run_once``) with an injected clock where time
matters; the ``statelog materializer run`` subprocesses run for real with short intervals
and a short lease ttl.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.background import start_background
from materializer.build import MaterializeOptions
from materializer.daemon.loop import MaterializerDaemon
from materializer.daemon.status import StatusWriter, read_statuses
from materializer.lease import current_holder, generation_key
from materializer.options import due
from statelog import ListStateDescriptor, StateJob, ValueStateDescriptor
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.layout import MATERIALIZER_STATUS_PREFIX
from statelog.materialization.manifest import (
    Manifest,
    latest_manifest_key,
    list_manifests,
    load_manifest,
)
from statelog.options.values import parse_duration, parse_size
from statelog.store.base import ObjectStore
from tests.support.s3server import RootSpec
from tests.support.wait import FakeClock, wait_until
from tools.cli import main

PROJECT = Path(__file__).resolve().parents[2]
MAXP = 16
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
EVENTS = ListStateDescriptor("events", pa.string())


# -- helpers -------------------------------------------------------------------------------------


class Job:
    """A one-operator job (parallelism 2) with a live reference of its state."""

    def __init__(self, spec: RootSpec) -> None:
        self.job: StateJob = statelog.open(spec.url, store_options=dict(spec.options), max_parallelism=MAXP)
        self.job.materialization_poll_s = 0.0  # adopt a new materialization at the next checkpoint
        self.backends = [self.job.backend("op", subtask=i, parallelism=2) for i in range(2)]
        self.round = 0

    def write(self, keys: int = 30) -> None:
        self.round += 1
        for i in range(keys):
            key = f"user-{(i * 7 + self.round) % 50}"
            b = self.backends[statelog.subtask_for_key_group(MAXP, 2, statelog.key_group_of(key, MAXP))]
            b.set_current_key(key)
            count = b.get_state(COUNT)
            count.update(count.value() + 1)
            b.get_state(EVENTS).add(f"r{self.round}-{i}")

    def checkpoint(self) -> CheckpointMetadata:
        return self.job.checkpoint({"src": self.round})

    def state(self) -> dict[str, Any]:
        return snapshot(self.backends)

    def close(self) -> None:
        self.job.close()


def snapshot(backends: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in backends:
        for key, _ns, v in b.get_state(COUNT).entries():
            out[f"count/{key}"] = v
        for key, _ns, v in b.get_state(EVENTS).entries():
            out[f"events/{key}"] = list(v)
    return out


def restored_state(spec: RootSpec, which: Any) -> dict[str, Any]:
    job = statelog.open(spec.url, store_options=dict(spec.options), create=False)
    try:
        return snapshot([job.backend("op", subtask=i, parallelism=2, restore=which, changelog=False)
                         for i in range(2)])
    finally:
        job.close()


@pytest.fixture
def job(store_root: RootSpec) -> Iterator[Job]:
    j = Job(store_root)
    yield j
    j.close()


@pytest.fixture
def file_job(file_root: RootSpec) -> Iterator[Job]:
    j = Job(file_root)
    yield j
    j.close()


def daemon(store: ObjectStore, owner: str, clock: Callable[[], float] | None = None, **kw: Any) -> MaterializerDaemon:
    kw.setdefault("run_gc", False)
    kw.setdefault("lease_ttl_s", 30.0)
    kw.setdefault("layout", MaterializeOptions(units=2))  # few files: fast on S3
    if clock is not None:
        kw["clock"] = clock
    return MaterializerDaemon(store, owner=owner, **kw)


def manifests(store: ObjectStore) -> list[Manifest]:
    return [load_manifest(store, key) for key, *_ in list_manifests(store)]


# -- trigger policy ------------------------------------------------------------------------------


def test_parse_duration_and_size() -> None:
    assert parse_duration("30s") == 30 and parse_duration("10m") == 600 and parse_duration("1h") == 3600
    assert parse_duration("250ms") == 0.25 and parse_duration("1.5") == 1.5 and parse_duration("2d") == 172800
    assert parse_size("256MB") == 256 << 20 and parse_size("1GiB") == 1 << 30 and parse_size("1000") == 1000
    assert parse_size("64k") == 64 << 10 and parse_size("1.5KB") == 1536
    for bad in ("", "ten", "5x", "-1s", "1e3s"):
        with pytest.raises(statelog.StatelogError, match="invalid duration"):
            parse_duration(bad)
    for bad in ("", "12XB", "-5", "0.5B", "1 2"):
        with pytest.raises(statelog.StatelogError, match="invalid size"):
            parse_size(bad)


def test_due_policy(file_job: Job) -> None:
    file_job.write()
    meta = file_job.checkpoint()
    tail = meta.changelog_bytes
    assert tail > 0
    now = 1000.0
    assert due(None, None, now, None, 60, 1 << 30) is None
    assert due(meta, None, now, None, 60, 1 << 30) == "first"

    class M:  # what due() reads of a manifest
        def __init__(self, cid: int, created_s: float) -> None:
            self.checkpoint_id, self.created_ms = cid, int(created_s * 1000)

    old = M(meta.checkpoint_id - 1, now - 10)
    assert due(meta, M(meta.checkpoint_id, now - 1e6), now, None, 60, 0) is None  # materialized
    assert due(meta, old, now, None, 60, 1 << 30) is None  # 10s < 60s, tail small
    assert due(meta, old, now, None, 5, 1 << 30) == "interval"  # from the manifest's created_ms
    assert due(meta, old, now, now - 1, 5, 1 << 30) is None  # the daemon's own time wins
    assert due(meta, old, now, None, 60, tail) == "tail-size"
    assert due(meta, old, now, None, 60, tail + 1) is None


def test_triggers_time_tail_and_nothing_new(job: Job, store_root: RootSpec) -> None:
    clock = FakeClock()
    with store_root.open() as store:
        d = daemon(store, "a", clock, interval_s=10.0, max_tail_bytes=1 << 30)
        s = d.run_once()
        assert (s["leader"], s["action"], s["reason"]) == (True, "none", "no checkpoint yet")

        job.write()
        job.checkpoint()
        s = d.run_once()
        assert (s["action"], s["reason"]) == ("materialized", "first")
        assert s["materialization"]["checkpoint_id"] == 1 and s["materialization"]["lease_generation"] == 1
        assert d.run_once()["action"] == "none"  # nothing new

        job.write()
        meta2 = job.checkpoint()
        assert meta2.manifest_keys() == {s["materialization"]["manifest"]}  # adopted
        clock.advance(5)
        s = d.run_once()
        assert (s["action"], s["latest_checkpoint"]["id"]) == ("none", 2)
        assert "not due" in s["reason"]
        clock.advance(5)  # 10s since the last materialization
        s = d.run_once()
        assert (s["action"], s["reason"], s["materialization"]["checkpoint_id"]) == ("materialized", "interval", 2)

        job.write()
        meta3 = job.checkpoint()
        d.max_tail_bytes = meta3.changelog_bytes + 1
        assert d.run_once()["action"] == "none"
        d.max_tail_bytes = meta3.changelog_bytes  # the tail reached the threshold: at once
        s = d.run_once()
        assert (s["action"], s["reason"], s["materialization"]["checkpoint_id"]) == ("materialized", "tail-size", 3)

        meta4 = job.checkpoint()  # no change since the materialization it builds on
        assert meta4.changelog_bytes == 0
        clock.advance(20)  # > interval, < lease ttl
        s = d.run_once()
        assert (s["action"], s["reason"]) == ("none", "checkpoint 4 has no changelog tail")
        s = d.run_once(force=True)  # forcing materializes any newer checkpoint
        assert (s["action"], s["reason"], s["materialization"]["checkpoint_id"]) == ("materialized", "forced", 4)
        assert [(m.checkpoint_id, m.lease_generation) for m in manifests(store)] == [(1, 1), (2, 1), (3, 1), (4, 1)]

        # a pause longer than the lease ttl: the own lease expired (nobody took it): losing a
        # held lease is final, the daemon does not take it again and run() would end with it
        clock.advance(100)
        d.max_tail_bytes = 1 << 30
        job.write()
        job.checkpoint()
        s = d.run_once()
        assert (s["leader"], s["generation"], s["action"]) == (False, None, "standby")
        assert "expired" in s["reason"] and "stalled" in s["reason"], s["reason"]
        lost = d.lost_error()
        assert lost is not None and "stops for good" in str(lost) and store.url in str(lost), lost
        assert [m.checkpoint_id for m in manifests(store)] == [1, 2, 3, 4]
        d.release()


# -- two daemons, one root -----------------------------------------------------------------------


def test_two_daemons_only_the_lease_holder_publishes(job: Job, store_root: RootSpec) -> None:
    with store_root.open() as sa, store_root.open() as sb:
        a = daemon(sa, "daemon-a", interval_s=0.001, max_tail_bytes=1)
        b = daemon(sb, "daemon-b", interval_s=0.001, max_tail_bytes=1)
        standby = []
        for _ in range(3):
            job.write()
            job.checkpoint()
            for d in (a, b) if job.round % 2 else (b, a):  # both orders
                s = d.run_once(force=True)
                if d is b:
                    standby.append(s)
        assert all(not s["leader"] and s["action"] == "standby" for s in standby)
        assert standby[-1]["holder"]["owner"] == "daemon-a" and standby[-1]["holder"]["generation"] == 1
        published = manifests(sa)
        assert [m.checkpoint_id for m in published] == [1, 2, 3]
        assert {m.lease_generation for m in published} == {1}
        assert (a.published, b.published) == (3, 0)
        assert current_holder(sa)["owner"] == "daemon-a"
        a.release()
        b.release()


def test_takeover_after_release_and_after_expiry(file_job: Job, file_root: RootSpec) -> None:
    clock = FakeClock()
    ttl = 30.0
    with file_root.open() as store:
        a = daemon(store, "a", clock, lease_ttl_s=ttl, interval_s=0.001)
        b = daemon(store, "b", clock, lease_ttl_s=ttl, interval_s=0.001)
        file_job.write()
        file_job.checkpoint()
        assert a.run_once()["action"] == "materialized"
        assert b.run_once()["action"] == "standby"

        # a clean stop releases the lease: the standby takes over at its next cycle
        a.release()
        file_job.write()
        file_job.checkpoint()
        s = b.run_once(force=True)  # (the fake clock stands still: force instead of the interval)
        assert (s["leader"], s["generation"], s["action"]) == (True, 2, "materialized")

        # b dies without releasing: a takes over only after observing the lease unchanged for a ttl
        c = daemon(store, "c", clock, lease_ttl_s=ttl, interval_s=0.001)
        file_job.write()
        file_job.checkpoint()
        assert c.run_once(force=True)["action"] == "standby"
        clock.advance(ttl / 2)
        assert c.run_once()["action"] == "standby"
        clock.advance(ttl / 2 + 1)
        s = c.run_once()
        assert (s["leader"], s["generation"], s["action"]) == (True, 3, "materialized")
        # the old holder comes back: its lease expired, it neither renews nor publishes
        file_job.write()
        file_job.checkpoint()
        s = b.run_once(force=True)
        assert (s["leader"], s["action"]) == (False, "standby")
        assert "expired" in s["reason"]
        assert [(m.checkpoint_id, m.lease_generation) for m in manifests(store)] == [(1, 1), (2, 2), (3, 3)]
        assert c.run_once(force=True)["materialization"]["lease_generation"] == 3


@pytest.mark.parametrize("how", ["expired", "taken-over"])
def test_stale_leader_cannot_publish(job: Job, store_root: RootSpec, how: str) -> None:
    """A's lease ends in the middle of its materialization; the fencing check stops the publish."""
    ttl = 30.0
    clock_a = FakeClock()
    clock_b = clock_a if how == "expired" else FakeClock()
    with store_root.open() as sa, store_root.open() as sb:
        b = daemon(sb, "b", clock_b, lease_ttl_s=ttl, interval_s=0.001)
        fired = []

        def mid_cycle(what: str, done: int, total: int) -> None:
            if "subtask state" in what and not fired:
                fired.append(what)
                assert not b.lease.try_acquire()  # B starts observing A's lease ...
                clock_b.advance(ttl + 1)  # ... which A does not renew for a ttl (A's clock too if shared)
                assert b.lease.try_acquire()

        a = daemon(sa, "a", clock_a, lease_ttl_s=ttl, interval_s=0.001, progress=mid_cycle)
        job.write()
        job.checkpoint()
        s = a.run_once()
        assert fired
        assert (s["action"], s["leader"], s["materialization"]) == ("fenced", False, None)
        assert a.lease.generation is None and a.published == 0
        assert manifests(sa) == []  # A wrote table files but never the manifest
        s = b.run_once()
        assert (s["action"], s["generation"]) == ("materialized", 2)
        assert [m.lease_generation for m in manifests(sa)] == [2]
        assert a.run_once()["action"] == "standby"
        b.release()


def test_a_long_materialization_keeps_its_lease(file_job: Job, file_root: RootSpec) -> None:
    """The keeper thread renews the lease while a materialization outlasts the ttl several times."""
    ttl = 1.0  # the shortest valid lease ttl (materializer/options.py)
    with file_root.open() as sa, file_root.open() as sb:
        b = daemon(sb, "b", lease_ttl_s=ttl)
        attempts = []

        def slow(what: str, done: int, total: int) -> None:
            if "subtask state" in what and not attempts:
                end = time.monotonic() + 4 * ttl
                while time.monotonic() < end:  # a standby keeps trying to take over meanwhile
                    attempts.append(b.lease.try_acquire())
                    time.sleep(ttl / 6)

        a = daemon(sa, "a", lease_ttl_s=ttl, interval_s=0.001, progress=slow)
        file_job.write()
        file_job.checkpoint()
        s = a.run_once()
        assert len(attempts) >= 10 and not any(attempts)
        assert (s["action"], s["generation"]) == ("materialized", 1)
        holder = current_holder(sa)
        assert (holder["generation"], holder["owner"]) == (1, "a") and holder["renewals"] >= 3
        a.release()


# -- adoption and restore ------------------------------------------------------------------------


def test_backends_adopt_the_materialization_and_restore_matches(job: Job, store_root: RootSpec) -> None:
    with store_root.open() as store:
        d = daemon(store, "a", interval_s=3600.0, run_gc=True, gc_grace_s=600.0)
        job.write()
        job.checkpoint()
        s = d.run_once()
        assert s["action"] == "materialized"
        assert s["gc"] is not None and s["gc"]["objects_deleted"] == 0  # everything is live or young
        key1 = s["materialization"]["manifest"]
        job.write()
        meta2 = job.checkpoint()
        live2 = job.state()
        assert meta2.manifest_keys() == {key1}  # the checkpoint builds on the materialization
        assert restored_state(store_root, 2) == live2
        assert d.run_once(force=True)["materialization"]["checkpoint_id"] == 2
        job.write()
        meta3 = job.checkpoint()
        live3 = job.state()
        assert meta3.manifest_keys() == {latest_manifest_key(store)}
        assert restored_state(store_root, "latest") == live3
        assert restored_state(store_root, 2) == live2
        d.release()


# -- background mode -----------------------------------------------------------------------------


def test_background_mode(file_job: Job, file_root: RootSpec) -> None:
    bg = start_background(file_job.job, interval_s=3600.0, lease_ttl_s=5.0, poll_s=0.05, run_gc=False)
    try:
        assert bg.running and bg.daemon.store is not file_job.job.store  # its own store handle
        file_job.write()
        file_job.checkpoint()
        s = bg.trigger(timeout=20)
        assert s["leader"] and s["latest_checkpoint"]["id"] == 1
        assert latest_manifest_key(file_job.job.store) is not None
        file_job.write()
        file_job.checkpoint()
        time.sleep(0.3)  # several cycles: checkpoint 2 is not due (interval 1h)
        assert bg.wait_idle(10)
        assert load_manifest(file_job.job.store, latest_manifest_key(file_job.job.store)).checkpoint_id == 1
        s = bg.trigger(timeout=20)
        assert (s["action"], s["reason"], s["materialization"]["checkpoint_id"]) == ("materialized", "forced", 2)
        file_job.write()
        meta3 = file_job.checkpoint()
        assert meta3.manifest_keys() == {s["materialization"]["manifest"]}
        live = file_job.state()
    finally:
        bg.stop()
    assert not bg.running
    holder = current_holder(file_job.job.store)
    assert holder["released"] and holder["owner"].startswith("background@")
    assert restored_state(file_root, "latest") == live


# -- command line --------------------------------------------------------------------------------


def test_cli_once_json_and_status(file_job: Job, file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    file_job.write()
    file_job.checkpoint()
    code = main(["materializer", "run", file_root.url, "--once", "--json", "--owner", "cli-test"])
    out = capsys.readouterr().out
    assert code == 0
    s = json.loads(out)
    assert (s["leader"], s["action"], s["reason"], s["owner"]) == (True, "materialized", "first", "cli-test")
    assert s["gc"]["ok"] is True
    assert main(["materializer", "status", file_root.url, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["lease"]["owner"] == "cli-test" and st["lease"]["state"] == "released"
    assert st["latest_materialization"]["checkpoint_id"] == 1 and st["latest_materialization"]["rows"] > 0
    assert st["latest_checkpoint"] == {**st["latest_checkpoint"], "id": 1, "materialized": True}
    assert main(["materializer", "status", file_root.url]) == 0
    text = capsys.readouterr().out
    assert "cli-test" in text and "released" in text and "checkpoint 1" in text
    assert main(["materializer", "run", file_root.url, "--once"]) == 0
    assert "nothing to do" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--interval", "5x"], "invalid duration '5x'"),
        (["--interval", "0s"], "--interval must be in [1ms, 30d]"),
        (["--lease-ttl", "soon"], "invalid duration 'soon'"),
        (["--max-tail-bytes", "12XB"], "invalid size '12XB'"),
        (["--retain", "0"], "invalid count '0'"),
    ],
)
def test_cli_bad_values(file_root: RootSpec, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["materializer", "run", file_root.url, *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_root_without_a_job(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["materializer", "run", file_root.url, "--once"]) == 2
    assert "not a statelog job root" in capsys.readouterr().err
    assert main(["materializer", "status", file_root.url]) == 2


def spawn(root: RootSpec, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "-v", "materializer", "run", root.url, "--interval", "0.2s",
         "--lease-ttl", "3s", "--poll", "0.1s", *args],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def terminate(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, float, str]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"no exit within {timeout}s of SIGTERM; stderr:\n{err}") from None
    return proc.returncode, time.monotonic() - t0, err


def newest(store: ObjectStore) -> tuple[int, int] | None:
    ms = list_manifests(store)
    return (ms[-1][1], ms[-1][2]) if ms else None


def test_sigterm_stops_promptly_and_releases_the_lease(file_job: Job, file_root: RootSpec) -> None:
    file_job.write()
    file_job.checkpoint()
    proc = spawn(file_root)
    try:
        with file_root.open() as store:
            wait_until(lambda: newest(store) == (1, 1), 60, "the first materialization")
            assert current_holder(store)["pid"] == proc.pid
            code, took, err = terminate(proc)
            assert code == 0, err
            # generous: the loop notices within 50 ms, the rest is the interpreter's exit (seconds on
            # a loaded machine); a daemon that ignored SIGTERM would not exit at all
            assert took < 60.0, err
            assert current_holder(store)["released"] is True
            assert "received SIGTERM" in err and "released generation 1" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_two_cli_daemons_only_the_holder_publishes(file_job: Job, file_root: RootSpec) -> None:
    procs = {"one": spawn(file_root, "--owner", "one"), "two": spawn(file_root, "--owner", "two")}
    try:
        with file_root.open() as store:
            file_job.write()
            file_job.checkpoint()
            wait_until(lambda: newest(store) == (1, 1), 60, "the first materialization")
            first = current_holder(store)
            holder, other = (first["owner"], "two" if first["owner"] == "one" else "one")
            assert first["generation"] == 1 and first["pid"] == procs[holder].pid
            for cid in (2, 3):
                file_job.write()
                file_job.checkpoint()
                wait_until(lambda cid=cid: newest(store) == (cid, 1), 30, f"checkpoint {cid} materialized")
            assert {(m.lease_generation) for m in manifests(store)} == {1}  # the standby published nothing
            code, _, err = terminate(procs[holder])
            assert code == 0, err
            # the standby takes over the released lease at its next cycle
            wait_until(lambda: (current_holder(store) or {}).get("owner") == other, 30, "the takeover")
            second = current_holder(store)
            assert second["generation"] == 2 and second["pid"] == procs[other].pid
            file_job.write()
            file_job.checkpoint()
            wait_until(lambda: newest(store) == (4, 2), 30, "checkpoint 4 materialized by the new holder")
            code, _, err = terminate(procs[other])
            assert code == 0, err
            assert "standby: lease generation 1" in err and "acquired generation 2" in err
            published = [(m.checkpoint_id, m.lease_generation) for m in manifests(store)]
            assert published == [(1, 1), (2, 1), (3, 1), (4, 2)]
            owners = {g: json.loads(store.get(generation_key(g)))["body"]["owner"] for g in (1, 2)}
            assert owners == {1: holder, 2: other}
            assert JobCatalog(store).latest().checkpoint_id == 4
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_stop_event_interrupts_the_loop_promptly(file_job: Job, file_root: RootSpec) -> None:
    with file_root.open() as store:
        d = daemon(store, "loop", interval_s=3600.0, poll_s=3600.0)
        stop = threading.Event()
        t = threading.Thread(target=d.run, args=(stop,))
        t.start()
        wait_until(lambda: d.cycles >= 1, 10, "the first cycle")
        t0 = time.monotonic()
        stop.set()
        t.join(5)
        assert not t.is_alive() and time.monotonic() - t0 < 30.0  # not the 3600 s poll
        assert current_holder(store)["released"] is True


def test_trigger_returns_the_forced_cycle_even_if_unforced_cycles_ran_since(file_job: Job) -> None:
    bg = start_background(file_job.job, interval_s=3600.0, lease_ttl_s=5.0, poll_s=0.02, run_gc=False)
    try:
        file_job.write()
        file_job.checkpoint()
        bg.trigger(timeout=20)  # checkpoint 1 materialized ("first"), by this or an unforced cycle
        file_job.write()
        file_job.checkpoint()  # checkpoint 2 is due by neither interval nor tail: only a forced cycle
        served = bg.daemon.wait_served

        def late_wake(ticket: int, timeout: float | None = None) -> bool:
            ok = served(ticket, timeout)
            time.sleep(0.3)  # the caller wakes late (a loaded machine): unforced cycles run meanwhile
            return ok

        bg.daemon.wait_served = late_wake  # type: ignore[method-assign]
        cycles = bg.daemon.cycles
        s = bg.trigger(timeout=20)
        assert bg.daemon.cycles >= cycles + 3  # unforced cycles ran after the forced one
        assert bg.daemon.last_summary is not None and bg.daemon.last_summary["action"] == "none"
        assert (s["action"], s["reason"], s["materialization"]["checkpoint_id"]) == ("materialized", "forced", 2)
    finally:
        bg.stop()


def test_a_daemon_whose_lease_was_taken_over_stops_for_good(file_job: Job, file_root: RootSpec) -> None:
    """run() of a daemon whose held lease another daemon took over ends with FencedError (it
    never goes back to standby to take the root again) and publishes nothing more."""
    from materializer.lease import LeaderLease
    from statelog.errors import FencedError

    with file_root.open() as sa, file_root.open() as sb:
        a = daemon(sa, "a", lease_ttl_s=1.0, poll_s=0.05)
        result: dict[str, Any] = {}

        def run_a() -> None:
            try:
                a.run()
            except BaseException as e:  # noqa: BLE001 - checked below
                result["error"] = e

        t = threading.Thread(target=run_a)
        t.start()
        wait_until(lambda: a.lease.generation, 30, "daemon a holds the lease")
        held = a.lease.generation
        b = LeaderLease(sb, "b", ttl_s=30.0)
        assert b.try_acquire(holder_is_dead=lambda body: True)  # as if a had been frozen for a ttl
        t.join(30)
        assert not t.is_alive()
        err = result.get("error")
        assert isinstance(err, FencedError), err
        msg = str(err)
        assert file_root.url in msg and f"generation {held + 1}" in msg and "'b'" in msg, msg
        assert "stops for good" in msg
        published = [m.checkpoint_id for m in manifests(sa)]
        file_job.write()
        file_job.checkpoint()
        time.sleep(0.3)  # a live loop would have cycled a few times meanwhile (poll 0.05 s)
        assert [m.checkpoint_id for m in manifests(sa)] == published
        assert a.lease.generation is None
        b.release()


def test_the_status_object_follows_every_cycle_and_one_per_daemon_remains(file_job: Job) -> None:
    """Objects are write-once: each cycle's status is a new object, the previous one deleted, so
    the newest status is always readable and a long-running daemon leaves one object."""
    store = file_job.job.store
    leftover = StatusWriter(store, "daemon-a")  # an earlier process of the same name
    leftover.cycle_done(1, {"action": "none"}, None)
    writer = StatusWriter(store, "daemon-a")
    for cycle in range(1, 4):
        writer.cycle_done(cycle, {"action": "materialized" if cycle == 3 else "none"}, None)
        statuses, errors = read_statuses(store)
        assert errors == [] and [s["cycles"] for s in statuses] == [cycle]
    assert statuses[0]["last_cycle"]["action"] == "materialized"
    assert [o.key for o in store.list(MATERIALIZER_STATUS_PREFIX)] == [writer.key]
