"""One writer per job root: the writer lease of a checkpoint publisher.

Two real processes on one root with the same operator: the second is refused and the first
keeps publishing, and no checkpoint holds the second's state; a SIGKILLed writer's successor
starts at once on the same host (dead or zombie pid) and after one ttl otherwise; a clean
close lets the successor start at once; a holder whose lease was taken over fails its next
checkpoint and publishes nothing."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor
from statelog.checkpoint.lease_objects import current_holder
from statelog.checkpoint.writer_lease import WriterLease
from statelog.errors import FencedError, LeaseHeldError, LeaseLostError
from statelog.layout import WRITER_LEASE_PREFIX
from tests.support.s3server import RootSpec

PROJECT = Path(__file__).resolve().parents[3]
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


class Writer:
    """``python -m tests.support.writer_proc``: its stdout lines arrive on a queue."""

    def __init__(self, spec: RootSpec, name: str, ttl_s: float) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH")) if p)
        env["WRITER_PROC_OPTIONS"] = json.dumps(dict(spec.options))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.writer_proc", spec.url, name, str(ttl_s)],
            cwd=PROJECT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.last = 0  # the id of the last checkpoint it reported
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("CHECKPOINT "):
                self.last = int(line.split()[1])
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EOF")

    def expect(self, word: str, timeout: float = 60.0) -> list[str]:
        """The fields of the next line starting with ``word`` (other lines are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.split(" ", 1)[0] == word:
                return line.split(" ")
            assert line != "EOF", f"the writer exited (code {self.proc.wait()}) before {word}"

    def checkpoints(self, count: int) -> int:
        """Wait for ``count`` more checkpoints; the last id."""
        return max(int(self.expect("CHECKPOINT")[1]) for _ in range(count))

    def stop(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        code = self.proc.wait(60)
        self._reader.join(30)  # every line read: self.last is final
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)


@pytest.fixture
def writers() -> Iterator[list[Writer]]:
    started: list[Writer] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            w.kill()
        w.proc.wait(30)


def spawn(writers: list[Writer], spec: RootSpec, name: str, ttl_s: float) -> Writer:
    w = Writer(spec, name, ttl_s)
    writers.append(w)
    return w


def restored_counts(spec: RootSpec) -> tuple[statelog.CheckpointMetadata, dict[str, int]]:
    with statelog.open(spec.url, store_options=dict(spec.options), writer_lease=False) as job:
        meta = job.latest_checkpoint()
        assert meta is not None
        b = job.backend("counter", restore=meta)
        state = b.get_state(COUNT)
        out = {}
        for key in ("A", "B", "total"):
            b.set_current_key(key)
            out[key] = state.value()
        return meta, out


def all_checkpoints(spec: RootSpec) -> list[statelog.CheckpointMetadata]:
    with statelog.open(spec.url, store_options=dict(spec.options), writer_lease=False) as job:
        return job.checkpoints()


def test_a_second_writer_is_refused_and_the_first_keeps_publishing(
    store_root: RootSpec, writers: list[Writer]
) -> None:
    a = spawn(writers, store_root, "A", 1.0)
    generation = int(a.expect("READY")[1])
    a.checkpoints(3)

    b = spawn(writers, store_root, "B", 1.0)
    refused = " ".join(b.expect("REFUSED"))
    assert b.proc.wait(60) == 3
    assert store_root.url in refused
    assert f"pid {a.proc.pid}" in refused and socket.gethostname() in refused
    assert "writer-proc A" in refused and "Stop that process first" in refused
    assert "secret" not in refused.lower() and store_root.options.get("secret_key", "x") not in refused

    a.checkpoints(5)  # A kept publishing after B was refused
    assert a.stop() == 0
    last = a.last
    metas = all_checkpoints(store_root)
    assert [m.checkpoint_id for m in metas] == list(range(1, last + 1))
    assert all(m.sources["writer"] == "A" and m.writer_generation == generation for m in metas)
    assert [m.sources["n"] for m in metas] == list(range(1, last + 1))  # nothing mixed or lost
    meta, counts = restored_counts(store_root)
    assert counts == {"A": last, "B": 0, "total": last}

    # A closed cleanly (released): the successor starts at once and continues A's state
    b2 = spawn(writers, store_root, "B", 1.0)
    ready = b2.expect("READY", timeout=30)
    assert (int(ready[1]), int(ready[2])) == (generation + 1, last)
    b2.checkpoints(2)
    assert b2.stop() == 0
    meta, counts = restored_counts(store_root)
    assert counts["A"] == last and counts["B"] == counts["total"] - last >= 2
    assert meta.writer_generation == generation + 1


@pytest.mark.parametrize("reap", [True, False], ids=["dead-pid", "zombie"])
def test_a_sigkilled_writers_successor_on_the_same_host_starts_at_once(
    file_root: RootSpec, writers: list[Writer], reap: bool
) -> None:
    ttl = 60.0  # only the dead-pid rule can let the successor in quickly
    a = spawn(writers, file_root, "A", ttl)
    generation = int(a.expect("READY")[1])
    last = a.checkpoints(3)
    a.kill()
    if reap:
        a.proc.wait(30)
    # else: still a zombie while B starts (not reaped by its parent)
    b = spawn(writers, file_root, "B", ttl)
    ready = b.expect("READY", timeout=30)
    assert time.monotonic() - b.started < ttl / 2
    assert int(ready[1]) == generation + 1 and int(ready[2]) >= last
    b.checkpoints(2)
    assert b.stop() == 0
    meta, counts = restored_counts(file_root)
    assert counts["A"] + counts["B"] == counts["total"] == meta.sources["n"]


def test_a_crashed_writer_elsewhere_is_taken_over_after_one_ttl(
    file_root: RootSpec, writers: list[Writer]
) -> None:
    ttl = 1.0
    a = spawn(writers, file_root, "A", ttl)
    generation = int(a.expect("READY")[1])
    a.checkpoints(2)
    a.kill()
    a.proc.wait(30)
    with file_root.open() as store:
        # a contender that cannot tell the holder's process (another host): the ttl decides
        lease = WriterLease(store, ttl_s=ttl, holder_is_dead=lambda body: False)
        t0 = time.monotonic()
        assert lease.acquire() == generation + 1
        waited = time.monotonic() - t0
        lease.release()
    assert ttl * 0.9 <= waited < ttl * 30  # at least one ttl: the rule, not the machine's speed


def test_a_second_writer_in_one_process_is_refused(file_root: RootSpec) -> None:
    with statelog.open(file_root.url, writer_lease_ttl_s=0.6) as first:
        first.backend("counter")
        with statelog.open(file_root.url, writer_lease_ttl_s=0.6) as second:
            with pytest.raises(LeaseHeldError, match=f"pid {os.getpid()}"):
                second.backend("counter")
            with pytest.raises(LeaseHeldError):
                second.checkpoint()
        first.checkpoint()


def test_a_fenced_writer_fails_its_next_checkpoint_and_publishes_nothing(file_root: RootSpec) -> None:
    with statelog.open(file_root.url, writer_lease_ttl_s=5.0) as job:
        b = job.backend("counter")
        b.set_current_key("k")
        b.get_state(COUNT).update(1)
        assert job.checkpoint().writer_generation == 1
        # a successor takes the lease over (as if this process had been frozen for a ttl)
        with file_root.open() as store:
            WriterLease(store, holder_is_dead=lambda body: True).acquire()
            b.get_state(COUNT).update(2)
            with pytest.raises(FencedError) as err:
                job.checkpoint()
            msg = str(err.value)
            assert file_root.url in msg and "generation 2 was acquired" in msg, msg
            assert f"pid {os.getpid()}" in msg and "stops for good" in msg, msg
            assert job.fenced is err.value
            before = {i.key for i in store.list("")} - _lease_keys(store)
            with pytest.raises(FencedError):  # and every later one
                job.checkpoint()
            with pytest.raises(FencedError):  # no new backend either
                job.backend("other", restore="none")
            with pytest.raises(FencedError):  # nor any write under the root
                job.store.put("anything", b"x")
            assert {i.key for i in store.list("")} - _lease_keys(store) == before
            assert job.catalog.checkpoint_ids() == [1]
            holder = current_holder(store, WRITER_LEASE_PREFIX)
            assert holder is not None and holder["generation"] == 2


def _lease_keys(store) -> set[str]:
    return {i.key for i in store.list(WRITER_LEASE_PREFIX)}


def test_an_expired_writer_lease_fails_the_checkpoint(file_root: RootSpec) -> None:
    with statelog.open(file_root.url, writer_lease_ttl_s=5.0) as job:
        b = job.backend("counter")
        b.set_current_key("k")
        b.get_state(COUNT).update(1)
        job.checkpoint()
        lease = job._lease.lease
        assert lease is not None
        lease._stop.set()  # the renewer stops, as in a process frozen longer than the ttl
        lease._thread.join()  # type: ignore[union-attr]
        lease._deadline = 0.0  # ... whose deadline has passed
        with pytest.raises(LeaseLostError, match="expired"):
            job.checkpoint()
        assert job.catalog.checkpoint_ids() == [1]


def test_runtime_workers_do_not_take_the_lease_and_old_metadata_reads(file_root: RootSpec) -> None:
    with statelog.open(file_root.url, writer_lease=False) as job:
        b = job.backend("counter")
        b.set_current_key("k")
        b.get_state(COUNT).update(1)
        meta = job.checkpoint()
        assert meta.writer_generation is None  # not recorded: read as before
        assert "writer_generation" not in meta.body()
    with file_root.open() as store:
        assert current_holder(store, WRITER_LEASE_PREFIX) is None
