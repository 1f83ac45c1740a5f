"""The in-progress marker of a savepoint write: ``savepoints/<name>/_writing-<n>.json``.

GC collects the objects below ``savepoints/<name>/`` of a savepoint without metadata once
the newest of them is older than its grace period (docs/gc.md). A write that runs longer
than that without writing a file (a long Spark stage) stays protected because
:class:`InProgress` writes a new marker every ``interval_s`` seconds until the write ends
(objects are write-once: marker ``n + 1`` is put, then marker ``n`` deleted);
the marker is deleted after the savepoint metadata is written, or with the leftovers of a
failed write. A killed writer stops refreshing it, so its leftovers age and GC collects them.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time

from statelog.errors import StoreError
from statelog.layout import savepoint_marker_key, savepoint_prefix
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

MARKER_PREFIX = "_writing-"
TASK_MARKER_BASE = 10**11
DEFAULT_INTERVAL_S = 60.0  # well below GC's default grace period (600 s)


def marker_key(name: str, n: int = 0) -> str:
    """The key of the ``n``-th marker of a write of savepoint ``name`` (:mod:`statelog.layout`)."""
    return savepoint_marker_key(name, n)


class InProgress:
    """Writes the marker at once and refreshes it from a daemon thread until :meth:`stop`.

    Usage: ``with InProgress(store, name): ...`` (or :meth:`start` / :meth:`stop`). A failed
    refresh is logged and retried at the next interval.
    """

    def __init__(self, store: ObjectStore, name: str, interval_s: float = DEFAULT_INTERVAL_S, *, first: int = 0) -> None:
        self.store = store
        self.name = name
        self.n = first  # a writer of its own series (a Spark task) starts at a number of its own
        self.key = marker_key(name, first)
        self.interval_s = interval_s
        self.started_ms = int(time.time() * 1000)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, key: str) -> None:
        body = {"savepoint": self.name, "started_ms": self.started_ms, "refreshed_ms": int(time.time() * 1000)}
        self.store.put(key, json.dumps(body).encode())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            old, new = self.key, marker_key(self.name, self.n + 1)
            try:
                self._put(new)
                self.n, self.key = self.n + 1, new
                self.store.delete(old)
            except StoreError as e:
                log.warning("savepoint %r: could not refresh the in-progress marker %s: %s", self.name, old, e)

    def mark(self) -> None:
        """Write the first marker only (no refresh): for a process that ends before the write does."""
        self._put(self.key)

    def start(self) -> InProgress:
        self._put(self.key)
        self._thread = threading.Thread(target=self._run, name=f"statelog-sp-marker-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, delete: bool = False) -> None:
        """Stop refreshing; with ``delete`` remove the marker (after the metadata was written)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if delete:
            try:
                self.store.delete(self.key)
            except StoreError as e:
                log.warning("savepoint %r: could not delete the in-progress marker %s: %s", self.name, self.key, e)

    def __enter__(self) -> InProgress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def task_marker_first() -> int:
    """Where a Spark task's own series of markers starts: a random 12-digit number, so that the
    tasks of one write (and their retries) never put the same marker key."""
    return TASK_MARKER_BASE + secrets.randbelow(TASK_MARKER_BASE)


def delete_markers(store: ObjectStore, name: str) -> None:
    """Delete every in-progress marker of savepoint ``name`` (once its metadata is written)."""
    try:
        for obj in list(store.list(savepoint_prefix(name) + MARKER_PREFIX)):
            store.delete(obj.key)
    except StoreError as e:
        log.warning("savepoint %r: could not delete its in-progress markers: %s", name, e)
