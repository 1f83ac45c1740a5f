"""Worker threads started before a restore gets busy: :class:`Workers`.

A ``ThreadPoolExecutor`` starts a thread at a ``submit``, and ``Thread.start`` waits until the
new thread ran. When another thread of the process is busy with the GIL (an on-demand
restore's background thread reading the tail, a pool thread that just got a file to decode),
that wait costs a GIL hand-over or two (the 5 ms switch interval each) on the thread that
submits, the task thread that installs the entries: a restore of 10^6 keys spent 11 ms of
its 280 ms starting its fetch and decode threads. :class:`Workers` starts all its threads at
once when it is made, before the restore's background thread runs, and keeps them until it
is closed.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Workers"]

T = TypeVar("T")

_Item = tuple[cf.Future[Any], Callable[..., Any], tuple[Any, ...]] | None


class Workers:
    """``threads`` threads, started now, that run submitted calls in submission order."""

    def __init__(self, threads: int, name: str) -> None:
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(max(1, threads))
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., T], /, *args: Any) -> cf.Future[T]:
        """Run ``fn(*args)`` on a thread; its future."""
        future: cf.Future[T] = cf.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("submit after the workers were closed")
            self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # (as ThreadPoolExecutor: the future carries it)
                future.set_exception(e)
            else:
                future.set_result(result)
            del future, fn, args, item

    def close(self) -> None:
        """Cancel the calls not started, wait for the running ones and stop the threads (as
        ``ThreadPoolExecutor.shutdown(wait=True, cancel_futures=True)``); again: nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in self._threads:
                self._queue.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
