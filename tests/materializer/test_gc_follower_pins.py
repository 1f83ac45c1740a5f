"""GC and followers: a live follower's lease (``followers/<id>.json``) pins the checkpoint it
follows, so retention keeps it and everything it references while the follower is behind; a
closed follower, or one whose lease expired (it died), pins nothing; an unreadable lease is
reported and pins nothing."""

from __future__ import annotations

import contextlib
import time

import pyarrow as pa

import statelog
from materializer.build import materialize
from materializer.gc.collect import collect_garbage
from statelog.errors import StatelogError
from statelog.following.pin import live_pins, read_pin
from statelog.layout import FOLLOWER_LEASE_PREFIX, follower_lease_key
from tests.support.s3server import RootSpec

COUNT = statelog.ValueStateDescriptor("count", pa.int64(), default=0)


def write(job: statelog.StateJob, backend: statelog.KeyedStateBackend, n: int) -> statelog.CheckpointMetadata:
    count = backend.get_state(COUNT)
    for k in range(n):
        backend.set_current_key(k % 50)
        count.update(count.value() + 1)
    return job.checkpoint()


def segments_of(meta: statelog.CheckpointMetadata) -> set[str]:
    return {seg.name for op in meta.operators.values() for h in op.subtasks for r in h.changelog for seg in r.segments}


def test_gc_keeps_the_checkpoint_a_live_follower_is_behind_at(file_root: RootSpec) -> None:
    job = statelog.open(file_root.url, max_parallelism=16)
    backend = job.backend("op", restore="none")
    first = write(job, backend, 200)
    follower = statelog.follow(file_root.url, poll_s=None, pin_ttl_s=60)  # at the first checkpoint, then behind
    [pin] = live_pins(job.store, time.time())[0]
    assert pin.checkpoint_ids == (first.checkpoint_id,)
    mid = write(job, backend, 200)
    materialize(job.store, mid)
    job.materialization_poll_s = 0.0
    write(job, backend, 100)
    newest = write(job, backend, 100)  # builds on the materialization: the first checkpoint's changelog is old
    assert newest.manifest_keys()

    report = collect_garbage(job.store, retain_checkpoints=1, grace_s=0)
    assert report.ok and first.checkpoint_id not in report.checkpoints_deleted
    assert first.checkpoint_id in job.catalog.checkpoint_ids()
    assert report.checkpoints_deleted  # the others went
    assert all(job.store.exists(key) for key in segments_of(first))  # what the follower still reads
    assert follower.get("op", "count", 3) == 4  # (200 updates over 50 keys)

    pos = follower.poll()  # catches up (a restore: the writer builds on a materialization now)
    assert pos.checkpoint_id == newest.checkpoint_id
    assert follower.get("op", "count", 3) == 12
    assert live_pins(job.store, time.time())[0][0].checkpoint_ids == (newest.checkpoint_id,)
    report = collect_garbage(job.store, retain_checkpoints=1, grace_s=0)
    assert first.checkpoint_id in report.checkpoints_deleted  # no longer pinned
    follower.close()
    assert not list(job.store.list(FOLLOWER_LEASE_PREFIX))  # closing deletes the lease
    job.close()


def test_a_dead_followers_lease_pins_nothing_after_its_ttl(file_root: RootSpec) -> None:
    job = statelog.open(file_root.url, max_parallelism=16)
    backend = job.backend("op", restore="none")
    first = write(job, backend, 50)
    follower = statelog.follow(file_root.url, poll_s=None, pin_ttl_s=5)
    follower._store.close()  # (as if killed: the lease stays behind)
    assert follower._pin.key is not None
    pin = read_pin(job.store, follower._pin.key)
    for _ in range(3):
        write(job, backend, 50)
    report = collect_garbage(job.store, retain_checkpoints=1, grace_s=0, now=pin.written_ms / 1000 + 1)
    assert first.checkpoint_id not in report.checkpoints_deleted  # live
    report = collect_garbage(job.store, retain_checkpoints=1, grace_s=0, now=pin.written_ms / 1000 + 6)
    assert first.checkpoint_id in report.checkpoints_deleted  # expired: pins nothing
    job.close()
    with contextlib.suppress(StatelogError):  # its store is closed; this ends its restore (the collector resumes)
        follower.close()


def test_an_unreadable_follower_lease_is_reported_and_pins_nothing(file_root: RootSpec) -> None:
    job = statelog.open(file_root.url, max_parallelism=16)
    backend = job.backend("op", restore="none")
    first = write(job, backend, 50)
    write(job, backend, 50)
    job.store.put(follower_lease_key("f-0123456789abcdef", 0), b'{"body": {}, "crc32": 1}')
    report = collect_garbage(job.store, retain_checkpoints=1, grace_s=0)
    assert first.checkpoint_id in report.checkpoints_deleted
    assert any("follower lease followers/f-0123456789abcdef/000000000000.json is ignored" in e for e in report.errors)
    job.close()
