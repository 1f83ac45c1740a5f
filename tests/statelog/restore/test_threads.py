"""Workers: threads started when made, calls run in order, close cancels what did not start."""

from __future__ import annotations

import threading
import time

import pytest

from statelog.restore.threads import Workers


def test_threads_run_from_the_start_and_calls_carry_results_and_errors() -> None:
    before = set(threading.enumerate())
    w = Workers(3, "test-workers")
    started = [t for t in threading.enumerate() if t not in before]
    assert sorted(t.name for t in started) == ["test-workers-0", "test-workers-1", "test-workers-2"]
    assert w.submit(pow, 2, 10).result(timeout=10) == 1024

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        w.submit(boom).result(timeout=10)
    w.close()
    assert not any(t.is_alive() for t in started)
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(pow, 2, 2)
    w.close()  # again: nothing


def test_close_waits_for_running_calls_and_cancels_queued_ones() -> None:
    w = Workers(1, "test-workers")
    running, release = threading.Event(), threading.Event()
    done: list[int] = []

    def slow() -> int:
        running.set()
        release.wait(10)
        done.append(1)
        return 1

    first = w.submit(slow)
    assert running.wait(10)
    queued = [w.submit(done.append, i) for i in range(5)]
    closer = threading.Thread(target=w.close)
    closer.start()
    deadline = time.monotonic() + 10
    while not all(f.cancelled() for f in queued) and time.monotonic() < deadline:  # close drained the queue
        time.sleep(0.005)
    release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert first.result() == 1 and done == [1]  # the running call finished, none of the queued ran
    assert all(f.cancelled() for f in queued)
