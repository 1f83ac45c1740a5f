"""A consumer-loop writer for the writer-lease tests: one process of a job on a root.

Run as ``python -m tests.support.writer_proc ROOT NAME TTL_S`` (store options as JSON in the
environment variable ``WRITER_PROC_OPTIONS``: not on the command line, where other users
could read secrets). It opens the root with the writer lease (ttl ``TTL_S``), restores the
latest checkpoint of operator ``counter`` and then, until it reads ``stop`` on stdin, adds 1
to the keys ``NAME`` and ``total`` and checkpoints with ``sources={"writer": NAME, "n": n}``
(``n`` = the value of ``total``). Lines on stdout (flushed)::

    REFUSED <message>              the lease is held by another live process (exit 3)
    READY <generation> <total>     the lease is held and the state restored
    CHECKPOINT <id> <n>            checkpoint published
    LOST <message>                 the lease was lost: nothing more is published (exit 4)
    CLOSED                         clean close (released the lease), exit 0
"""

from __future__ import annotations

import json
import os
import sys
import threading

import pyarrow as pa

import statelog
from statelog import ValueStateDescriptor
from statelog.errors import LeaseHeldError, LeaseLostError

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def main() -> int:
    root, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    options = json.loads(os.environ.get("WRITER_PROC_OPTIONS", "{}"))
    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    job = statelog.open(
        root,
        store_options=options,
        writer_lease_ttl_s=ttl,
        writer_owner=f"writer-proc {name}",
        retain_checkpoints=1000,
    )
    try:
        try:
            backend = job.backend("counter", restore="latest")
        except LeaseHeldError as exc:
            say("REFUSED", str(exc).replace("\n", " "))
            return 3
        count = backend.get_state(COUNT)
        backend.set_current_key("total")
        total = count.value()
        say("READY", job.acquire_writer_lease(), total)
        while not stop.wait(0.02):
            for key in (name, "total"):
                backend.set_current_key(key)
                count.update(count.value() + 1)
            total += 1
            try:
                meta = job.checkpoint(sources={"writer": name, "n": total})
            except LeaseLostError as exc:
                say("LOST", str(exc).replace("\n", " "))
                return 4
            say("CHECKPOINT", meta.checkpoint_id, total)
    finally:
        job.close(flush=False)
    say("CLOSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
