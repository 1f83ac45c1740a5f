"""The cyclic garbage collector paused while a restore builds state.

A restore allocates millions of objects without reference cycles (keys, values, lists);
every 700 container allocations would start a collection, and the older generations'
collections traverse the whole heap of the process, so their cost grows with the state
already loaded. Reference counting frees everything as usual meanwhile.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["gc_paused", "pause_gc_while_loading", "resume_gc"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk restore."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_paused_by_loaders = 0
_paused_lock = threading.Lock()
_gc_was_enabled = False


def pause_gc_while_loading() -> None:
    """An on-demand restore started: pause the cyclic collector until :func:`resume_gc`
    (the loaders allocate the restored state over a longer time, from two threads). Counted:
    the collector resumes when the last loader is done."""
    global _paused_by_loaders, _gc_was_enabled
    with _paused_lock:
        if _paused_by_loaders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _paused_by_loaders += 1


def resume_gc() -> None:
    global _paused_by_loaders
    with _paused_lock:
        _paused_by_loaders -= 1
        if _paused_by_loaders == 0 and _gc_was_enabled:
            gc.enable()
