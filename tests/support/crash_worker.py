"""Crash-test worker: writes state forever until it is SIGKILLed.

Run as ``python -m tests.support.crash_worker ROOT SEED [--options-json JSON]``. Each start
opens the job, restores the latest checkpoint (or starts empty) and then applies the
operations ``op(SEED, i)`` for ``i = offset, offset + 1, ...`` (see ``tests.support.crash_ops``),
checkpointing on the deterministic schedule of :func:`tests.support.crash_ops.checkpoint_plan`
with ``sources={"offset": position}``.

The worker keeps a model beside the backend for reads only: every read result is asserted
against it, nothing is derived from it. It starts as a copy of the restored state (checking
the restore against an independent replay is the parent test's job, which it does before
every start), so startup does not grow with the length of the stream.

Progress lines on stdout (flushed), for the parent test::

    START <pid>                        imports done
    READY <restored id or -> <offset>  restored and checked, running
    BEGIN <offset>                     one-call checkpoint started
    SNAP <id> <offset>                 two-phase checkpoint: sync part done
    CHECKPOINT <id> <offset>           checkpoint published

Exit code 0 never happens (the loop is infinite); an exception exits with code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import statelog
from tests.support.crash_ops import OPERATOR_UID, CrashDriver, checkpoint_plan, model_from_backend
from tests.support.harness import Clock


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


DISK_CACHE_ENTRIES = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.support.crash_worker", description=__doc__.split("\n")[0]
    )
    p.add_argument("root", help="job root URL (file:// or s3://)")
    p.add_argument("seed", type=int, help="seed of the operation stream")
    p.add_argument("--options-json", default="{}", help="store options as a JSON object")
    p.add_argument("--persist-delay", type=float, default=0.2, help="changelog persist delay (s)")
    p.add_argument("--rate", type=float, default=1500.0, help="operations per second (pacing)")
    p.add_argument("--retain", type=int, default=5, help="checkpoints to retain")
    p.add_argument("--disk", action="store_true", help="the disk-backed working set, a tiny cache")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    seed = args.seed
    job = statelog.open(
        args.root,
        store_options=json.loads(args.options_json),
        writer_options={"persist_delay": args.persist_delay},
        retain_checkpoints=args.retain,
        state_store="disk" if args.disk else "memory",
    )
    if args.disk:
        job.state_cache_entries = DISK_CACHE_ENTRIES  # far fewer than the keys: reads go to disk
    meta = job.latest_checkpoint()
    offset = int(meta.sources["offset"]) if meta is not None else 0
    clock = Clock(offset)
    # the worker's backend restores on demand (the default): the model is read from an eager
    # restore of the same checkpoint by a reader (it reads the states' tables directly)
    backend = job.backend(OPERATOR_UID, restore=meta, clock=clock)
    reader = statelog.open(
        args.root, store_options=json.loads(args.options_json), create=False, writer_lease=False,
        state_store="disk" if args.disk else "memory",
    )  # fmt: skip
    if args.disk:
        reader.state_cache_entries = DISK_CACHE_ENTRIES
    model = model_from_backend(reader.backend(OPERATOR_UID, restore=meta, clock=clock, changelog=False, on_demand=False))
    reader.close()
    driver = CrashDriver(backend, model, clock)
    say("READY", meta.checkpoint_id if meta is not None else "-", offset)

    i = offset
    next_seal, delay = checkpoint_plan(seed, offset)
    pending = None  # (checkpoint id, PendingSnapshot, position at the seal, publish at)
    t0, i0 = time.monotonic(), i
    while True:
        driver.step(seed, i)
        i += 1
        if pending is not None and i >= pending[3]:
            cid, snap, position, _ = pending
            handle = snap.result(60)
            published = job.publish_checkpoint(cid, [handle], {"offset": position})
            say("CHECKPOINT", cid, published.sources["offset"])
            pending = None
        if pending is None and i >= next_seal:
            if delay == 0:
                say("BEGIN", i)
                published = job.checkpoint(sources={"offset": i})
                say("CHECKPOINT", published.checkpoint_id, published.sources["offset"])
            else:
                cid = job.next_checkpoint_id()
                pending = (cid, backend.snapshot(cid), i, i + delay)
                say("SNAP", cid, i)
            next_seal, delay = checkpoint_plan(seed, i)
        if i % 32 == 0:  # pace: keep the op rate near --rate
            ahead = (i - i0) / args.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    say("START", os.getpid())
    run(args)


if __name__ == "__main__":
    main()
