"""The coordinator of an on-demand restore: :class:`KeyGroupLoader`, the task thread's side.

The task thread takes key groups (or slices of them) from the loader when it first touches
them, and installs what the background thread prepared whenever it passes a key it has not
seen yet and at every snapshot; only the task thread writes the states' tables. The parts
that prepare key groups are in the modules next to this one: table files
(:mod:`~statelog.restore.ondemand.files`), the tail (:mod:`~statelog.restore.ondemand.tail`),
slices (:mod:`~statelog.restore.ondemand.slices`), the background thread
(:mod:`~statelog.restore.ondemand.background`) and the rest loaded at once
(:mod:`~statelog.restore.ondemand.bulk`).
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import threading
from collections.abc import Callable, Iterator
from typing import Any

from statelog.checkpoint.metadata import ChangelogRange
from statelog.keys.groups import KeyGroupRange
from statelog.restore.changes import BaseFile
from statelog.restore.collector import pause_gc_while_loading, resume_gc
from statelog.restore.ondemand.background import BackgroundLoader
from statelog.restore.ondemand.bulk import BulkLoader
from statelog.restore.ondemand.files import TableFiles
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.restore.ondemand.parts import LoaderParts
from statelog.restore.ondemand.prepare import EntryBuilder, PreparedKeyGroup
from statelog.restore.ondemand.progress import KeyGroupState, Progress
from statelog.restore.ondemand.slices import Slices
from statelog.restore.ondemand.tail import Records, TailReader
from statelog.store.base import ObjectStore

__all__ = ["KeyGroupLoader", "Take"]


class Take(enum.Enum):
    """What :meth:`KeyGroupLoader.take` prepares for the task thread."""

    FIRST = "first"  # a key group nobody prepared: the key's slice or the whole, once its slices are known
    SLICE = "slice"  # the slice of a key group that holds the key
    REST = "rest"  # what is left of a key group after the slices handed out
    WHOLE = "whole"  # a whole key group
    ALL = "all"  # every key group at once: the state is only a small tail, no table file


class KeyGroupLoader:
    """Loads the materialized tables and changelog tail of a key-group range, per key group."""

    def __init__(
        self,
        store: ObjectStore,
        files: list[BaseFile],
        ranges: list[ChangelogRange],
        key_groups: KeyGroupRange,
        *,
        options: OnDemandOptions | None = None,
        background: bool = True,
        raw_keys: bool = False,
        max_run: int | None = None,
    ) -> None:
        self.key_groups = key_groups
        self.options = options = options or OnDemandOptions()
        self._background = background  # False: key groups load only when touched (tests)
        # a disk-backed working set takes key bytes (not decoded keys), a few key groups at a time
        self._raw_keys = raw_keys
        self.progress = Progress(key_groups)
        pause = self.progress.pause_for_task
        self.files = TableFiles(store, files, key_groups, options, pause, max_run)
        self.tail = TailReader(store, ranges, key_groups, options, pause)
        self.builder = EntryBuilder(self.tail, raw_keys, key_groups.start)
        self.slices = Slices(self.files, self.tail, self.builder)
        parts = LoaderParts(self.progress, self.files, self.tail, self.builder, self.slices)
        self.background = BackgroundLoader(parts, options.read_ahead)
        self._bulk = BulkLoader(parts, options, raw_keys)
        self._gc_paused = False

    @property
    def bytes_read(self) -> int:
        """Bytes of table files and changelog segments read so far."""
        return self.files.bytes_read + self.tail.bytes_read

    @property
    def rows(self) -> int:
        """Rows of table files prepared so far."""
        return self.builder.rows

    @property
    def records(self) -> int:
        """Change records prepared so far."""
        return self.builder.records

    def start(self, check_keys: Callable[[str, Any], None]) -> None:
        """Pause the cyclic garbage collector until :meth:`close` (the loaders allocate the
        restored state over a longer time, from two threads: :func:`pause_gc_while_loading`)
        and start the background thread; ``check_keys(state, key_array)`` raises on keys the
        backend cannot restore (it runs on every table and tail prepared)."""
        self.builder.check_keys = check_keys
        pause_gc_while_loading()
        self._gc_paused = True
        if self._background:
            self.background.start()

    # -- task thread ---------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Every key group was handed to the task thread."""
        return self.progress.done

    def load(self, install: Callable[[PreparedKeyGroup], None], kg: int | None, kb: bytes | None = None) -> bool:
        """Install (``install``) what the background thread prepared, then key group ``kg``, or
        the slice of it that holds key bytes ``kb`` (prepared here if nobody does it): True if
        a part of ``kg`` was installed now."""
        for p in self.progress.take_ready():
            install(p)
        if kg is None:
            return False
        p = self.take(kg, kb)
        if p is None:
            return False
        try:
            install(p)
        finally:
            self.installed()
        return True

    def take(self, kg: int, kb: bytes | None = None) -> PreparedKeyGroup | None:
        """The prepared state of key group ``kg``, or of the slice of it that holds key bytes
        ``kb`` (prepared here if nobody does it), or ``None`` if that was handed out before.

        A key group whose table files have several row groups of its own is loaded by slices
        of about a row group (:mod:`statelog.restore.ondemand.slices`): a record's key waits
        only for its slice; the rest of the key group is loaded later (by the background
        thread, or by a later take of a key in it), without the slices handed out. What this
        returns has priority until the caller says it is installed (:meth:`installed`):
        meanwhile the background thread pauses."""
        pr = self.progress
        with pr.cond:
            while True:
                pr.raise_error()
                st = pr.state[kg]
                if st is KeyGroupState.TAKEN:
                    return None
                if st is KeyGroupState.READY:
                    pr.state[kg] = KeyGroupState.TAKEN
                    pr.taken += 1
                    pr.urgent += 1
                    pr.cond.notify_all()
                    return pr.ready.pop(kg)
                if st is KeyGroupState.PARTIAL:
                    if kb is None:
                        mode, i = Take.REST, 0
                    else:
                        mode, i = Take.SLICE, self.slices.index(kg, kb)
                        if i in self.slices.taken[kg]:
                            return None
                    break
                if st is KeyGroupState.UNLOADED:
                    mode, i = Take.FIRST, 0
                    break
                pr.cond.wait(0.05)  # the background thread is preparing it
            claimed = [kg]
            if mode is Take.FIRST and self.tail.whole_first and self.files.empty and not self._raw_keys:
                # only a small tail to load: every key group at once, as an eager restore does
                mode, claimed = Take.ALL, pr.in_state(KeyGroupState.UNLOADED)
            pr.mark(claimed, KeyGroupState.PREPARING)
            pr.urgent += 1
        try:
            mode, i, prepared = self._prepare(mode, kg, kb, i, claimed)
        except BaseException as e:
            self.installed()
            pr.fail(e)
            raise
        with pr.cond:
            if mode is Take.SLICE:
                self.slices.taken.setdefault(kg, set()).add(i)
                pr.state[kg] = KeyGroupState.PARTIAL
            else:
                pr.mark(claimed, KeyGroupState.TAKEN)
                pr.taken += len(claimed)
            pr.cond.notify_all()
        return prepared

    def _prepare(
        self, mode: Take, kg: int, kb: bytes | None, i: int, claimed: list[int]
    ) -> tuple[Take, int, PreparedKeyGroup]:
        """Prepare what :meth:`take` claimed: ``(what it became, slice, prepared)``."""
        if mode is Take.ALL:
            self.tail.read_whole()
            return mode, i, self.builder.tail_part(claimed)
        tail: cf.Future[Records] | None = None
        if mode is Take.FIRST:  # its tail is read meanwhile (on a remote store: other requests)
            tail = self.tail.read_soon(kg)
            if kb is not None and self.slices.bounds_of(kg):
                mode, i = Take.SLICE, self.slices.index(kg, kb)
            else:
                mode = Take.WHOLE
        if mode is Take.SLICE:
            return mode, i, self.slices.prepare_slice(kg, i, tail)
        # the whole key group, or what is left of it after the slices handed out
        return mode, i, self.slices.prepare_rest(kg, tail)

    def installed(self) -> None:
        """The key group :meth:`take` returned is installed (or failed): the background
        thread goes on."""
        with self.progress.cond:
            self.progress.urgent -= 1
            self.progress.cond.notify_all()

    def take_all(self) -> Iterator[PreparedKeyGroup]:
        """Every key group not handed out yet, for a task thread that waits for all of them
        (:meth:`KeyedStateBackend.wait_loaded <statelog.state.backend.KeyedStateBackend.wait_loaded>`;
        :meth:`BulkLoader.take_all <statelog.restore.ondemand.bulk.BulkLoader.take_all>`)."""
        return self._bulk.take_all()

    def close(self) -> None:
        """Stop the background thread, drop what is held and resume the garbage collector."""
        pr = self.progress
        with pr.cond:
            pr.stop = True
            pr.cond.notify_all()
        thread = pr.thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()
        pr.ready.clear()
        self.tail.close()
        if self._gc_paused:
            self._gc_paused = False
            resume_gc()
