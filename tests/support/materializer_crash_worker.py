"""Crash-test worker: the ``statelog`` CLI, started ahead of time and released on a signal.

Run as ``python -m tests.support.materializer_crash_worker ARG...``. It imports the command line and
the materializer (the slow part of a start: pyarrow, rich, minio), prints ``READY <pid>``
and waits for one line on stdin; then it runs ``statelog ARG...`` (``tools.cli.main``) in
this process, exactly as ``python -m tools.cli ARG...`` would, and exits with its exit
code. An empty stdin (EOF) exits with code 3 without running anything. The line
``go hold-tables`` makes the run stop once it has written a materialization's table files,
before it publishes the manifest: it prints ``TABLES WRITTEN`` on stderr and waits to be
killed, so that the test can leave a partial materialization behind whatever the timing.

``tests.e2e.test_materializer_crash`` starts the next worker while it checks the job root
after a kill, so the interpreter start does not add to every iteration, and releases it
(``materializer run ROOT --once ...``) only once the checks are done.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import materializer.daemon.loop  # noqa: F401 - imported here, before READY
import materializer.gc.collect  # noqa: F401
from materializer.build import InProcessEngine
from tools.cli import main

HOLD_S = 120.0


def hold_after_tables() -> None:
    """Stop every materialization between its table files and its manifest."""
    write_tables = InProcessEngine.write_tables

    def holding(self: InProcessEngine, *args: Any, **kwargs: Any) -> Any:
        result = write_tables(self, *args, **kwargs)
        sys.stderr.write("TABLES WRITTEN\n")
        sys.stderr.flush()
        time.sleep(HOLD_S)  # the test kills the process meanwhile
        return result

    InProcessEngine.write_tables = holding  # type: ignore[method-assign]


def run(argv: list[str]) -> int:
    sys.stdout.write(f"READY {os.getpid()}\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        return 3
    if line.split()[1:] == ["hold-tables"]:
        hold_after_tables()
    sys.stdout.write("GO\n")
    sys.stdout.flush()
    return main(argv)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
