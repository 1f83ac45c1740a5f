"""A copy of a job that stalls longer than the writer-lease ttl loses its root for good.

Copy 1 of the Kafka clickstream job (Kafka in, Kafka out exactly once) runs in its own
process; it is stopped (SIGSTOP) for longer than the ttl, copy 2 starts on the same root,
takes the lease over and completes a checkpoint, then copy 1 is resumed while copy 2 runs.
Copy 1 must end within one ttl of waking with the FencedError (root, new holder, what
happened) and never restart, recover its sinks or initialise a transactional id again; the
output committed to Kafka (read_committed) must be exactly the golden output.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from statelog.checkpoint.catalog import JobCatalog
from statelog.store import open_store
from tests.support import jobs
from tests.support.kafka.broker import KafkaBroker
from tests.support.kafka.jobs import produce_clicks, read_topic
from tests.support.wait import wait_until

pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.fault]

PROJECT = Path(__file__).resolve().parents[4]
TTL_S = 3.0  # the writer-lease ttl of both copies
PER_SPLIT = 1000
RATE = 200  # records/s per source subtask: each copy runs for several seconds


class Proc:
    """``python -m MODULE ARGS``; its stdout lines arrive on a queue, stderr goes to a file."""

    def __init__(self, module: str, args: list[str], log: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH")) if p)
        self.log = log
        self._err = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=PROJECT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self._err, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EOF")

    def expect(self, *words: str, timeout: float = 120.0) -> list[str]:
        """The next line that starts with one of ``words`` (split in 3); fails on exit first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {words} within {timeout}s; stderr:\n{self.tail()}") from None
            if line.split(" ", 1)[0] in words:
                return line.split(" ", 2)
            if line == "EOF":
                code = self.proc.wait()
                raise AssertionError(f"exited (code {code}) before {words}; stderr:\n{self.tail()}")

    def tail(self) -> str:
        self._err.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def close(self) -> None:
        for pid in [*descendants(self.pid), self.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        self._err.close()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (its job's workers and their forkserver)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def checkpoint_of_generation(root: str, generation: int) -> Callable[[], int | None]:
    """A predicate: the id of a retained checkpoint published under lease ``generation``."""

    def check() -> int | None:
        store = open_store(root)
        try:
            catalog = JobCatalog(store)
            for cid in reversed(catalog.checkpoint_ids()):
                with contextlib.suppress(Exception):  # pruned by retention meanwhile
                    if catalog.load(cid).writer_generation == generation:
                        return cid
            return None
        finally:
            store.close()

    return check


@dataclass
class Copies:
    """The job's input (clicks produced beforehand) and output topics, its root and
    transactional-id prefix, shared by the copies of the job that one test starts."""

    broker: KafkaBroker
    logs: Path
    tin: str
    tout: str
    root_path: Path
    prefix: str
    procs: list[Proc] = field(default_factory=list)

    @property
    def root(self) -> str:
        return self.root_path.as_uri()

    def start(self, log: str, expect: str | None = "RUNNING") -> Proc:
        """Copy ``python -m tests.support.kafka.stall_job``, waiting for ``expect`` unless None."""
        args = [self.broker.bootstrap_servers, self.tin, self.tout, self.root, self.prefix, str(RATE), str(TTL_S)]
        p = Proc("tests.support.kafka.stall_job", args, self.logs / log)
        self.procs.append(p)
        if expect is not None:
            p.expect(expect)
        return p

    def golden_output(self) -> bool:
        return sorted(read_topic(self.broker, self.tout)) == jobs.golden_windows(PER_SPLIT)


@pytest.fixture
def copies(kafka_broker: KafkaBroker, tmp_path: Path) -> Iterator[Copies]:
    tin = kafka_broker.create_topic(partitions=jobs.CLICK_SPLITS)
    tout = kafka_broker.create_topic(partitions=2)
    produce_clicks(kafka_broker, tin, PER_SPLIT)
    c = Copies(kafka_broker, tmp_path, tin, tout, tmp_path / "root", f"stall-{uuid.uuid4().hex[:8]}")
    try:
        yield c
    finally:
        for p in c.procs:
            p.close()


# 5 runs in a row: STATELOG_STALL_RUNS=5 pytest tests/runtime/connectors/kafka/test_fencing.py -k master_loses
@pytest.mark.parametrize("run", range(int(os.environ.get("STATELOG_STALL_RUNS", "1"))))
def test_a_stalled_job_master_loses_its_root_for_good(copies: Copies, run: int) -> None:
    first = copies.start("first.log")
    wait_until(checkpoint_of_generation(copies.root, 1), 120, "copy 1 completes a checkpoint")
    os.kill(first.pid, signal.SIGSTOP)  # the master only: its workers keep running
    stopped = time.monotonic()
    second = copies.start("second.log")
    wait_until(checkpoint_of_generation(copies.root, 2), 120, "copy 2 completes a checkpoint")
    assert time.monotonic() - stopped > TTL_S
    woke = time.monotonic()
    os.kill(first.pid, signal.SIGCONT)
    _, attempts, message = first.expect("FENCED", "DONE", timeout=60)
    took = time.monotonic() - woke
    assert first.proc.wait(30) == 3, first.tail()
    assert took <= TTL_S, f"copy 1 ended {took:.2f}s after waking (ttl {TTL_S}s)"
    assert copies.root in message and "stalled for" in message and f"longer than the lease ttl {TTL_S:g}s" in message
    assert f"pid {second.pid}" in message and "stops for good" in message, message
    assert attempts == "1", f"copy 1 restarted: attempt {attempts}"
    second.expect("DONE", timeout=300)
    assert second.proc.wait(30) == 0
    assert copies.golden_output()


def test_a_stalled_worker_does_not_cost_the_root(copies: Copies) -> None:
    """A worker stopped for longer than the ttl: its master keeps renewing the lease, so a
    second copy is refused; once resumed, the job finishes with exact output."""
    first = copies.start("first.log")
    wait_until(checkpoint_of_generation(copies.root, 1), 120, "copy 1 completes a checkpoint")
    workers = [p for p in descendants(first.pid) if "forkserver" not in Path(f"/proc/{p}/cmdline").read_text()]
    assert workers, "no worker process found"
    os.kill(workers[0], signal.SIGSTOP)
    stopped = time.monotonic()
    second = copies.start("second.log", expect=None)
    _, message = second.expect("REFUSED", timeout=120)[:2]
    assert second.proc.wait(30) == 4
    wait_until(lambda: time.monotonic() - stopped > TTL_S * 1.5, 30, "a stall past the ttl")
    os.kill(workers[0], signal.SIGCONT)
    first.expect("DONE", timeout=300)
    assert first.proc.wait(30) == 0
    assert copies.golden_output()


LOOP_RECORDS = 3000
LOOP_KEYS = 30


def test_a_stalled_consumer_loop_with_a_transactional_producer_stops_for_good(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The user's consumer loop (``tests/support/kafka/stall_loop.py``): stalled past the ttl after a
    checkpoint, replaced by a second copy with the same transactional id; once resumed, its
    next checkpoint (or the fenced producer) ends it with the FencedError, and the committed
    output holds every input record exactly once with per-key counts 1..n."""
    from confluent_kafka import Producer

    tin = kafka_broker.create_topic(partitions=3)
    tout = kafka_broker.create_topic(partitions=1)
    p = Producer(kafka_broker.config(**{"linger.ms": 20}))
    for i in range(LOOP_RECORDS):
        p.produce(tin, str(i).encode(), key=f"k{i % LOOP_KEYS}".encode(), partition=i % 3)
    assert p.flush(30) == 0
    root, txn = (tmp_path / "root").as_uri(), f"loop-{uuid.uuid4().hex[:8]}"

    def loop(log: str, *extra: str) -> Proc:
        args = [kafka_broker.bootstrap_servers, tin, tout, root, txn, str(TTL_S), "400", *extra]
        proc = Proc("tests.support.kafka.stall_loop", args, tmp_path / log)
        proc.expect("READY")
        return proc

    first, second = loop("first.log"), None
    try:
        for _ in range(3):
            first.expect("CHECKPOINT")
        os.kill(first.pid, signal.SIGSTOP)  # right after a commit: its next transaction is open
        stopped = time.monotonic()
        second = loop("second.log", "--finish")
        second.expect("CHECKPOINT")
        assert time.monotonic() - stopped > TTL_S
        woke = time.monotonic()
        os.kill(first.pid, signal.SIGCONT)
        message = " ".join(first.expect("FENCED", timeout=60)[1:])
        took = time.monotonic() - woke
        assert first.proc.wait(30) == 3, first.tail()
        assert took <= TTL_S, f"copy 1 ended {took:.2f}s after waking (ttl {TTL_S}s)"
        assert root in message and "stalled for" in message and f"pid {second.pid}" in message, message
        second.expect("DONE", timeout=300)
        assert second.proc.wait(30) == 0
    finally:
        first.close()
        if second is not None:
            second.close()
    out = [tuple(r) for r in read_topic(kafka_broker, tout)]
    positions = sorted((r[0], r[1]) for r in out)
    assert positions == sorted((i % 3, i // 3) for i in range(LOOP_RECORDS)), "lost or duplicated output"
    by_key: dict[str, list[int]] = {}
    for _p, _o, key, n in out:
        by_key.setdefault(key, []).append(n)
    assert all(sorted(ns) == list(range(1, len(ns) + 1)) for ns in by_key.values()), "state not exactly once"


def test_the_workers_of_a_stalled_master_stop_writing_when_its_lease_runs_out(copies: Copies) -> None:
    """The master is stopped, its workers are not: they keep reading and would keep uploading
    changelog; the write grant of runtime/worker/lease_grant.py stops them at the lease's deadline,
    before any other copy may take the root."""
    first = copies.start("first.log")

    def objects() -> dict[str, float]:
        return {str(p.relative_to(copies.root_path)): p.stat().st_mtime for p in copies.root_path.rglob("*") if p.is_file()}

    wait_until(checkpoint_of_generation(copies.root, 1), 120, "copy 1 completes a checkpoint")
    os.kill(first.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    time.sleep(TTL_S + TTL_S / 3 + 0.5)  # past the deadline, the margin and a worker's wait
    before = objects()
    time.sleep(2.0)  # records keep arriving: a worker that still wrote would upload segments
    after = objects()
    assert after == before, f"written after the master's lease ran out: {sorted(set(after) - set(before))}"
    assert time.monotonic() - stopped > TTL_S
