"""``StateJob.checkpoint_async``: the synchronous part now, durability and publication on a
thread (statelog/checkpoint/pending.py)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import statelog
from statelog.errors import StatelogError, StorePermissionError
from statelog.store import open_store
from statelog.testing import FaultInjectingStore

COUNT = statelog.ValueStateDescriptor("count", pa.int64(), default=0)


def _job(root: str, store=None) -> tuple[statelog.StateJob, object, object]:
    job = statelog.StateJob(root, store=store) if store is not None else statelog.open(root)
    b = job.backend("op", restore="none" if store is not None else None)
    return job, b, b.get_state(COUNT)


def _write(b, s, keys, times: int = 1) -> None:
    for _ in range(times):
        for k in keys:
            b.set_current_key(k)
            s.update(s.value() + 1)


def _restored(root: str, checkpoint_id: int) -> dict[int, int]:
    job = statelog.open(root)
    try:
        return _read(job.backend("op", restore=checkpoint_id))
    finally:
        job.close(flush=False)


def _read(b) -> dict[int, int]:
    s = b.get_state(COUNT)
    out = {}
    for k in range(100):
        b.set_current_key(k)
        out[k] = s.value()
    return out


def test_the_loop_goes_on_while_the_checkpoint_waits_for_durability_and_it_publishes_in_order(tmp_path) -> None:
    root = tmp_path.as_uri()
    store = FaultInjectingStore(open_store(root))
    gate = threading.Event()
    store.before("put", lambda op, key: gate.wait(30) if key.startswith("changelog/") else None)
    job, b, s = _job(root, store)
    _write(b, s, range(50))
    pending = job.checkpoint_async(sources={"input": {0: 50}})
    assert pending.checkpoint_id == 1 and not pending.done()  # its changes are not durable yet
    _write(b, s, range(50, 100))  # the loop goes on: these are not in checkpoint 1
    assert not pending.done() and job.latest_checkpoint() is None
    seen: list[int] = []
    pending.add_done_callback(lambda p: seen.append(p.result().checkpoint_id))
    gate.set()
    meta = pending.result(30)
    assert (meta.checkpoint_id, meta.sources) == (1, {"input": {0: 50}}) and seen == [1]
    assert "published" in repr(pending)
    second = job.checkpoint_async(sources={"input": {0: 100}})
    third = job.checkpoint(sources={"input": {0: 100}})  # waits for the second first
    assert second.done() and (second.result().checkpoint_id, third.checkpoint_id) == (2, 3)
    assert job.metrics.completed == 3
    job.close()
    assert _restored(root, 1) == {k: 1 if k < 50 else 0 for k in range(100)}
    assert _restored(root, 2) == dict.fromkeys(range(100), 1)


def test_close_publishes_the_checkpoint_in_flight_and_close_without_flush_cancels_it(tmp_path) -> None:
    root = tmp_path.as_uri()
    job, b, s = _job(root)
    _write(b, s, range(100), times=2)
    job.checkpoint_async(sources={"input": {0: 200}})
    job.close()
    reopened = statelog.open(root)
    assert reopened.latest_checkpoint().checkpoint_id == 1
    reopened.close()
    assert _restored(root, 1) == dict.fromkeys(range(100), 2)

    store = FaultInjectingStore(open_store(root))
    gate = threading.Event()
    store.before("put", lambda op, key: gate.wait(10) if key.startswith("changelog/") else None)
    job = statelog.StateJob(root, store=store)
    b = job.backend("op", restore=1)
    s = b.get_state(COUNT)
    _write(b, s, range(100))
    pending = job.checkpoint_async(sources={"input": {0: 300}})
    threading.Timer(0.3, gate.set).start()  # the upload thread the writer's close joins
    job.close(flush=False)  # a crash: the checkpoint is cancelled, nothing publishes it
    assert pending.done()
    with pytest.raises(BaseException):  # noqa: B017 - cancelled or failed, never published
        pending.result(1)
    reopened = statelog.open(root)
    assert reopened.latest_checkpoint().checkpoint_id == 1
    reopened.close()


def test_a_checkpoint_that_fails_in_the_background_fails_the_next_checkpoint_unless_its_result_was_taken(
    tmp_path,
) -> None:
    root = tmp_path.as_uri()
    store = FaultInjectingStore(open_store(root))
    job, b, s = _job(root, store)
    _write(b, s, range(10))
    store.fail_next("put", 1, key_prefix="changelog/", error=StorePermissionError)
    pending = job.checkpoint_async(sources={"input": {0: 10}}, timeout=20)
    assert pending.wait(30) and pending.error() is not None
    with pytest.raises(StatelogError, match="checkpoint 1 failed in the background"):
        job.checkpoint(sources={"input": {0: 10}})
    assert job.metrics.failed >= 1
    job.close(flush=False)

    store = FaultInjectingStore(open_store(tmp_path.joinpath("second").as_uri()))
    job, b, s = _job(tmp_path.joinpath("second").as_uri(), store)
    _write(b, s, range(10))
    store.fail_next("put", 1, key_prefix="changelog/", error=StorePermissionError)
    pending = job.checkpoint_async(sources={"input": {0: 10}}, timeout=20)
    with pytest.raises(StatelogError):
        pending.result(30)  # seen by the caller: the next checkpoint does not raise it again
    with pytest.raises(StatelogError) as e:  # the writer failed for good: this one fails on its own
        job.checkpoint(sources={"input": {0: 10}})
    assert "in the background" not in str(e.value)
    job.close(flush=False)
