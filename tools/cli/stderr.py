"""What the CLI writes to stderr: the one error line and the log records (``-v``).

:mod:`tools.cli` imports this before it knows which command runs, so it imports nothing
heavy (no ``rich``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def log_to_stderr(verbosity: int) -> Iterator[None]:
    """Send the log records of statelog, the materializer, the runtime and the tools to stderr.

    The warning per retry of a store call (``statelog.store.retry``) only with ``-v``: without
    it, a store that cannot be reached is the one error line after the last attempt."""
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(n) for n in ("statelog", "tools", "materializer", "runtime", "statelog.store.retry")]
    saved = [lg.level for lg in loggers]
    logging.getLogger().addHandler(handler)
    for lg in loggers:
        lg.setLevel(level)
    if verbosity <= 0:
        logging.getLogger("statelog.store.retry").setLevel(logging.ERROR)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        for lg, lvl in zip(loggers, saved, strict=True):
            lg.setLevel(lvl)


def error(message: str) -> None:
    """One line on stderr, no traceback."""
    sys.stderr.write(f"statelog: error: {message}\n")
    sys.stderr.flush()
