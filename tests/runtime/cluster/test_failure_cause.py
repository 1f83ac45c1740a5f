"""The job master names the cause of a failed attempt: a worker's channel error is secondary
when a peer died, even if the peer's death becomes visible to the master a little later (a
forkserver child's exit reaches its ``Popen`` only after the forkserver reaped it)."""

from __future__ import annotations

import time

import pytest

from runtime.cluster.control import PEER_DEATH_GRACE_S
from runtime.cluster.launcher import WorkerProc
from runtime.cluster.master import JobMaster
from runtime.errors import TaskFailedError, WorkerLostError


class _Handle:
    """A worker process handle that is seen dead from ``dies_at`` (monotonic time) on."""

    def __init__(self, dies_at: float | None) -> None:
        self.dies_at = dies_at
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        if self.dies_at is not None and time.monotonic() >= self.dies_at:
            self.exitcode = -9
            return False
        return True


def _master(peer_dies_in: float | None) -> tuple[JobMaster, WorkerProc]:
    now = time.monotonic()
    survivor = WorkerProc(0, _Handle(None), None, pid=100)  # type: ignore[arg-type]
    peer = WorkerProc(1, _Handle(None if peer_dies_in is None else now + peer_dies_in), None, pid=101)  # type: ignore[arg-type]
    master = object.__new__(JobMaster)  # only the worker list is used by this message
    master.workers = [survivor, peer]
    return master, survivor


def test_a_channel_error_names_the_peer_seen_dead_a_moment_later() -> None:
    master, survivor = _master(peer_dies_in=0.2)
    with pytest.raises(WorkerLostError, match=r"worker 1 \(pid 101\) exited with code -9"):
        master._on_message(survivor, ("failed", 0, "ChannelError: channel (0, 0, 1) to 127.0.0.1:1 failed"))


def test_a_channel_error_without_a_dead_peer_is_the_task_failure() -> None:
    master, survivor = _master(peer_dies_in=None)
    t0 = time.monotonic()
    with pytest.raises(TaskFailedError, match="ChannelError"):
        master._on_message(survivor, ("failed", 0, "ChannelError: connection refused"))
    assert PEER_DEATH_GRACE_S <= time.monotonic() - t0 < PEER_DEATH_GRACE_S + 30.0  # it waited the grace


def test_any_other_failure_is_reported_at_once() -> None:
    master, survivor = _master(peer_dies_in=0.0)
    looked: list[object] = []
    master._dead_peer = looked.append  # type: ignore[method-assign]  # the grace wait is not entered
    with pytest.raises(TaskFailedError, match="ValueError"):
        master._on_message(survivor, ("failed", 0, "ValueError: bad record"))
    assert looked == []
