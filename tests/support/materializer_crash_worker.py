"""Crash-test worker: the ``statelog`` CLI, started ahead of time and released on a signal.

Run as ``python -m tests.support.materializer_crash_worker ARG...``. It imports the command line and
the materializer (the slow part of a start: pyarrow, rich, minio), prints ``READY <pid>``
and waits for one line on stdin; then it runs ``statelog ARG...`` (``tools.cli.main``) in
this process, exactly as ``python -m tools.cli ARG...`` would, and exits with its exit
code. An empty stdin (EOF) exits with code 3 without running anything.

``tests.e2e.test_materializer_crash`` starts the next worker while it checks the job root
after a kill, so the interpreter start does not add to every iteration, and releases it
(``materializer run ROOT --once ...``) only once the checks are done.
"""

from __future__ import annotations

import os
import sys

import materializer.daemon.loop  # noqa: F401 - imported here, before READY
import materializer.gc.collect  # noqa: F401
from tools.cli import main


def run(argv: list[str]) -> int:
    sys.stdout.write(f"READY {os.getpid()}\n")
    sys.stdout.flush()
    if not sys.stdin.readline():
        return 3
    sys.stdout.write("GO\n")
    sys.stdout.flush()
    return main(argv)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
