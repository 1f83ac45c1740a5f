"""Stop a loop on SIGTERM or SIGINT: :func:`stop_on_signals`.

The consumer loop of :class:`runtime.app.Application` and ``statelog materializer run`` both
run until a signal asks them to stop, and then finish what they are doing (a final checkpoint,
a released lease) instead of dying in the middle of it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event, action: str = "stopping", logger: logging.Logger | None = None
) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT set ``stop`` (logged at INFO as ``received
    SIGTERM: <action>`` on ``logger``) instead of raising :class:`KeyboardInterrupt`. A second
    SIGINT once ``stop`` is set raises :class:`KeyboardInterrupt` (a user's second Ctrl-C
    interrupts at once); a second SIGTERM changes nothing. The previous handlers are restored
    when the block ends. Signal handlers can only be installed from the main thread: in any
    other thread the block runs without them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    out = logger if logger is not None else log

    def handler(signum: int, _frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        out.info("received %s: %s", signal.Signals(signum).name, action)
        stop.set()

    saved = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
