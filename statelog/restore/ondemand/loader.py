"""On-demand restore: a restored backend's state, loaded key group by key group.

Opening a backend at a checkpoint on demand reads only the checkpoint's handles, the
manifests they build on (:meth:`statelog.restore.changes.RestoredChanges.plan`) and the timers
(their tables and changelog streams, which are small, and must be complete before event time
may pass a timer). Everything else is loaded per key group by a :class:`KeyGroupLoader`:

* the first time the task touches a key group (the key of a record, of a firing timer, of a
  query), the backend takes that key group from the loader: it is prepared at once in the
  task thread, or, if the background thread is preparing it already, waited for;
* a background thread prepares the other key groups in key-group order, at most
  ``read_ahead`` key groups ahead of what the task thread has installed (the memory a
  restore needs beyond the loaded state is bounded by that and by the table files being
  decoded);
* only the task thread writes the states' tables: it installs what the background thread
  prepared whenever it passes a key it has not seen yet and at every snapshot;
* a task thread that waits for the whole state
  (:meth:`KeyedStateBackend.wait_loaded <statelog.backend.KeyedStateBackend.wait_loaded>`)
  stops the background thread and loads the rest as an eager restore does
  (:meth:`KeyGroupLoader.take_all`): the remaining files fetched in order by a pool, each
  piece of whole key groups decoded by another as soon as its files are in, ahead of the
  task thread, which builds the piece's keys and entries at once; the tail replayed once at
  the end, with no hand-over between threads.

A key group with several row groups of its own in a table file is loaded by *slices*, the
key ranges of those row groups (their statistics on ``key``): a first touch prepares the
slice of the key only (the row groups that may hold its range, and the records of the key
group's tail in the range); the key group is then partly loaded, and its other slices load
when touched, the rest (without the slices handed out) in the background or in
:meth:`KeyGroupLoader.take_all`. What the task thread takes has priority until installed:
the background thread pauses at its next safe point meanwhile.

Preparing a key group reads the state-table files that hold it (each file fetched and
verified against the size and CRC-32 its manifest recorded once, its bytes kept until its
last key group was prepared; each preparation decodes only the row groups of its key groups)
and its share of the changelog tail: the background thread reads the whole tail first and
splits it by key group; a key group needed before that reads its own records alone (the
reader filters blocks by key group before decoding rows, and keeps the segments it read whole,
and their decoded blocks, for the next key groups), unless the tail is one of small segments
(``SEGMENT_READ_COST_BYTES`` per segment at most): then the first thread that needs a part of
it reads it whole, once, and if there is no table file to load, the first touch installs it
for every key group at once. An object that is missing or corrupt
fails the preparation of the first key group that needs it, with the object's name; the error
is raised in the task thread at its next installation, never swallowed.

What a checkpoint taken while loading references does not depend on what was loaded: the
restored materialized parts and changelog ranges stay in the backend's handles until it
adopts a materialization, which it does only once fully loaded.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.reader import WHOLE_OBJECT_LIMIT, ChangeBatch, SegmentReader
from statelog.checkpoint import ChangelogRange
from statelog.descriptors import StateInfo
from statelog.keys import KeyGroupRange
from statelog.materialization import (
    RANGED_MIN_BYTES,
    RangedTableFile,
    TableFile,
    decode_key_range,
    decode_table_file,
    fetch_table_file,
    key_range_mask,
    key_slices,
)
from statelog.restore.changes import BaseFile, base_entries
from statelog.store.base import ObjectStore

__all__ = ["KeyGroupLoader", "PreparedKeyGroup", "split_timers"]

DEFAULT_READ_AHEAD = 8  # key groups prepared ahead of the task thread's installations
DECODE_AHEAD = 2  # pieces of runs decoded ahead when the task thread loads the rest (take_all)
UNIT_ROWS = 131_072  # rows of such a piece, about (whole key groups)
FETCH_AHEAD_BYTES = 256 << 20  # table file bytes take_all fetches before it decodes them
FETCH_THREADS = 4
TAIL_PIECE_ROWS = 4096  # change records turned into Python objects between two safe points
TOUCH_WHOLE_BYTES = 1 << 20  # a key group's own tail reads larger segments in ranges
IO_THREADS = 4  # segments a key group's own tail reads at once
TOUCH_KEEP_BYTES = 64 << 20  # decoded blocks of small segments kept for other key groups' touches
# a segment read costs about as much as turning this many bytes of a segment into records: a
# tail of at most this many bytes per segment is read whole by the first key group that needs
# it (a touch of a key group alone would read every segment, and so would the next one)
SEGMENT_READ_COST_BYTES = 16 << 10

# a key group's state in the loader; _PARTIAL: some of its slices were handed out, the rest not
_UNLOADED, _PREPARING, _READY, _TAKEN, _PARTIAL = range(5)

Records = dict[str, list[tuple[bytes, bytes, int, Any, Any, int | None]]]  # per state, in order


def split_timers(
    files: list[BaseFile], ranges: list[ChangelogRange]
) -> tuple[list[BaseFile], list[ChangelogRange], list[BaseFile], list[ChangelogRange]]:
    """``(timer files, timer ranges, other files, other ranges)``: each state has its own
    changelog stream, named ``<prefix>/<state name>`` (docs/format.md 4.7)."""

    def is_timer_range(r: ChangelogRange) -> bool:
        return r.stream.rsplit("/", 1)[-1] in TIMER_STATES

    return (
        [f for f in files if f[0].name in TIMER_STATES],
        [r for r in ranges if is_timer_range(r)],
        [f for f in files if f[0].name not in TIMER_STATES],
        [r for r in ranges if not is_timer_range(r)],
    )


@dataclass
class PreparedKeyGroup:
    """One key group's restored state, decoded, ready to be installed into the tables."""

    key_group: int
    # per state: (keys, namespaces, entries) of each materialized table part (base_entries;
    # key bytes instead of keys for a disk-backed working set)
    base: dict[str, list[tuple[list[Any], list[bytes], list[Any]]]] = field(default_factory=dict)
    # per state: change records (key bytes, namespace bytes, op, user key, value, expires), in order
    records: Records = field(default_factory=dict)
    rows: int = 0


class _File:
    """A table file being read for its key groups: fetched and verified once, its bytes kept
    until its last key group was prepared; each preparation decodes only the row groups of
    its key groups."""

    __slots__ = ("lock", "data", "left", "ranged")

    def __init__(self, left: int) -> None:
        self.lock = threading.Lock()
        self.data: bytes | None = None
        self.left = left
        self.ranged: RangedTableFile | None = None  # its footer and the row groups read so far


def _split(table: pa.Table, kgs: list[int]) -> list[tuple[pa.Table, list[tuple[int, int]]]]:
    """``table`` (the rows of ``kgs``) as ``(rows, [(key group, rows)])`` parts in table order:
    one part when the rows are sorted by key group, as state tables are (docs/format.md 8)."""
    col = table.column("key_group").to_numpy()
    if len(col) == 0:
        return []
    if bool((np.diff(col) >= 0).all()):
        groups, counts = np.unique(col, return_counts=True)
        return [(table, [(int(g), int(n)) for g, n in zip(groups, counts, strict=True)])]
    out = []  # not sorted (never written so): one filter per key group
    for kg in kgs:
        part = table.filter(pc.equal(table.column("key_group"), kg))
        out.append((part, [(kg, part.num_rows)]))
    return out


class KeyGroupLoader:
    """Loads the materialized tables and changelog tail of a key-group range, per key group."""

    def __init__(
        self,
        store: ObjectStore,
        files: list[BaseFile],
        ranges: list[ChangelogRange],
        key_groups: KeyGroupRange,
        *,
        read_ahead: int = DEFAULT_READ_AHEAD,
        background: bool = True,
        raw_keys: bool = False,
        max_run: int | None = None,
    ) -> None:
        self.store = store
        self.key_groups = key_groups
        self._ranges = ranges
        self._read_ahead = max(1, read_ahead)
        self._background = background  # False: key groups load only when touched (tests)
        # a disk-backed working set takes key bytes (not decoded keys), a few key groups at a time
        self._raw_keys = raw_keys
        self._max_run = max_run
        self._files_of: dict[int, list[tuple[BaseFile, _File]]] = {}
        for info, f, kgr in files:
            mine = f.key_groups.intersect(kgr)
            if mine is None:
                continue
            entry = _File(len(mine))
            for kg in mine:
                self._files_of.setdefault(kg, []).append(((info, f, mine), entry))
        self._cond = threading.Condition()
        self._state = dict.fromkeys(key_groups, _UNLOADED)
        self._ready: dict[int, PreparedKeyGroup] = {}
        self._taken = 0
        self._tail: dict[int, Records] | None = None
        self._tail_lock = threading.Lock()
        self._tail_alone: set[int] = set()  # key groups whose records were read alone
        # slices (statelog.materialization.key_slices): the bounds of each key group's slices
        # (an empty list: not sliced), the slices of each _PARTIAL key group handed out, and
        # the tail of each key group being loaded by slices
        self._bounds: dict[int, list[bytes]] = {}
        self._slices_taken: dict[int, set[int]] = {}
        self._kg_tails: dict[int, Records] = {}
        self._stop = False
        # preparations under way in the task thread (a record waits for them): the background
        # thread pauses for them at its next safe point, so they do not share the GIL with it
        self._urgent = 0
        self.error: BaseException | None = None
        self.check_keys: Callable[[str, Any], None] = lambda _state, _keys: None
        # figures for logs and stats
        self._file_bytes = 0
        self._stats_lock = threading.Lock()
        # one reader for the whole tail (segments read whole) and one for the tails of key
        # groups read alone (larger segments read in ranges), each caching the footers it read;
        # the second keeps the decoded blocks of the segments it read whole (a tail of many small
        # segments, one per checkpoint, is then read once, not once per key group touched) until
        # the whole tail is in
        self._reader = SegmentReader(store)
        self._touch_reader = SegmentReader(store, keep_bytes=TOUCH_KEEP_BYTES)
        # a tail of many small segments (one per checkpoint since the last materialization,
        # say) is read whole once, by the first thread that needs a part of it, instead
        segments = {s.name: s.size for r in ranges for s in r.segments}
        self._whole_first = sum(segments.values()) <= SEGMENT_READ_COST_BYTES * len(segments)
        self._whole_lock = threading.Lock()
        self.files_fetched = 0  # whole
        self.files_ranged = 0  # read in ranges (some of them fetched whole later)
        self.rows = 0
        self.records = 0
        self.started = time.monotonic()
        # a touch's requests: its tail's segments (IO_THREADS at once), read by a helper thread
        # while the task thread reads the key group's table files
        self._io: tuple[cf.ThreadPoolExecutor, cf.ThreadPoolExecutor] | None = None
        self._thread = threading.Thread(target=self._run, name="statelog-ondemand-restore", daemon=True)

    @property
    def bytes_read(self) -> int:
        """Bytes of table files and changelog segments read so far."""
        return self._file_bytes + self._reader.bytes_read + self._touch_reader.bytes_read

    def start(self, check_keys: Callable[[str, Any], None]) -> None:
        """Start the background thread; ``check_keys(state, key_array)`` raises on keys the
        backend cannot restore (it runs on every table and tail prepared)."""
        self.check_keys = check_keys
        if self._background:
            self._thread.start()

    # -- task thread ---------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Every key group was handed to the task thread."""
        return self._taken == len(self._state)

    def take(self, kg: int, kb: bytes | None = None) -> PreparedKeyGroup | None:
        """The prepared state of key group ``kg``, or of the slice of it that holds key bytes
        ``kb`` (prepared here if nobody does it), or ``None`` if that was handed out before.

        A key group whose table files have several row groups of its own is loaded by slices
        of about a row group (statelog.materialization.key_slices): a record's key waits only
        for its slice; the rest of the key group is loaded later (by the background thread,
        or by a later take of a key in it), without the slices handed out. What this returns
        has priority until the caller says it is installed (:meth:`installed`): meanwhile the
        background thread pauses."""
        with self._cond:
            while True:
                self._raise_error()
                st = self._state[kg]
                if st == _TAKEN:
                    return None
                if st == _READY:
                    self._state[kg] = _TAKEN
                    self._taken += 1
                    self._urgent += 1
                    self._cond.notify_all()
                    return self._ready.pop(kg)
                if st == _PARTIAL:
                    if kb is None:
                        mode = "rest"
                    else:
                        mode, i = "slice", self._slice_of(kg, kb)
                        if i in self._slices_taken[kg]:
                            return None
                    break
                if st == _UNLOADED:
                    mode = "first"
                    break
                self._cond.wait(0.05)  # the background thread is preparing it
            if mode == "first" and self._whole_first and not self._files_of and not self._raw_keys:
                # only a small tail to load: every key group at once, as an eager restore does
                claimed = [k for k, s in self._state.items() if s == _UNLOADED]
                for k in claimed:
                    self._state[k] = _PREPARING
                self._urgent += 1
                mode = "all"
            else:
                self._state[kg] = _PREPARING
                self._urgent += 1
        if mode == "all":
            try:
                self._read_whole_tail()
                prepared = self._tail_part(claimed)
            except BaseException as e:
                self.installed()
                self._fail(e)
                raise
            with self._cond:
                for k in claimed:
                    self._state[k] = _TAKEN
                self._taken += len(claimed)
                self._cond.notify_all()
            return prepared
        try:
            tail: cf.Future[Records] | None = None
            if mode == "first":  # its tail is read meanwhile (on a remote store: other requests)
                tail = self._pools()[1].submit(self._kg_tail, kg)
                if kb is not None and self._slice_bounds(kg):
                    mode, i = "slice", self._slice_of(kg, kb)
                else:
                    mode = "whole"
            if mode == "slice":
                prepared = self._prepare_slice(kg, i, tail)
            else:  # the whole key group, or what is left of it after the slices handed out
                prepared = self._prepare_rest(kg, tail)
        except BaseException as e:
            self.installed()
            self._fail(e)
            raise
        with self._cond:
            if mode == "slice":
                self._slices_taken.setdefault(kg, set()).add(i)
                self._state[kg] = _PARTIAL
            else:
                self._state[kg] = _TAKEN
                self._taken += 1
            self._cond.notify_all()
        return prepared

    def installed(self) -> None:
        """The key group :meth:`take` returned is installed (or failed): the background
        thread goes on."""
        with self._cond:
            self._urgent -= 1
            self._cond.notify_all()

    def take_ready(self) -> list[PreparedKeyGroup]:
        """Every key group the background thread prepared since the last call."""
        with self._cond:
            self._raise_error()
            if not self._ready:
                return []
            out = list(self._ready.values())
            self._ready.clear()
            for p in out:
                self._state[p.key_group] = _TAKEN
            self._taken += len(out)
            self._cond.notify_all()  # room for the read-ahead
            return out

    def take_all(self) -> Iterator[PreparedKeyGroup]:
        """Every key group not handed out yet, for a task thread that waits for all of them
        (:meth:`KeyedStateBackend.wait_loaded`). The background thread claims no more key
        groups (what it prepared is taken first, the run it is preparing last), and the rest is
        loaded as an eager restore loads it, a run at a time: table files fetched and decoded
        by a pool (outside the GIL) in pieces of whole key groups of about ``UNIT_ROWS`` rows,
        ``DECODE_AHEAD`` pieces ahead of this thread, which builds the keys and entries of a
        piece at once (one part per piece and state, not one per key group); then the tail
        (the whole tail the background thread read, or this thread reads if there is none)
        is replayed once, after every base entry is in."""
        runs: list[list[int]] = []
        with self._cond:  # the background thread claims nothing more; what it prepares is taken below
            self._stop = True
            self._cond.notify_all()
            self._raise_error()
            partial = [kg for kg, st in self._state.items() if st == _PARTIAL]
            for kg in partial:
                self._state[kg] = _PREPARING
            for run in self._runs():
                claimed = [kg for kg in run if self._state[kg] == _UNLOADED]
                for kg in claimed:
                    self._state[kg] = _PREPARING
                if claimed:
                    runs.extend(self._units(claimed))
        # the files' bytes are fetched by FETCH_THREADS threads in order, in waves of at most
        # FETCH_AHEAD_BYTES; a piece's decoding starts once its files are in (the decoding
        # thread waits on a file's lock while it is being fetched)
        waves = self._fetch_waves(runs)
        fetcher = cf.ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="statelog-ondemand-fetch")
        pool = cf.ThreadPoolExecutor(max(1, min(DECODE_AHEAD, len(runs) + len(partial))),
                                     thread_name_prefix="statelog-ondemand-decode")  # fmt: skip
        try:
            self._fetch_wave(waves.popleft() if waves else [], fetcher)
            # the rest of key groups loaded by slices so far, decoded by the pool first
            rests = [pool.submit(self._rest_rows, kg) for kg in partial]
            ahead = collections.deque(pool.submit(self._decode, run) for run in runs[:DECODE_AHEAD])
            for kg, rows in zip(partial, rests, strict=True):
                p = self._prepare_rest(kg, decoded=rows.result())
                with self._cond:
                    self._state[kg] = _TAKEN
                    self._taken += 1
                yield p
            yield from self.take_ready()
            with self._cond:  # the whole tail, if the background thread is reading it
                while self._tail is None and self.error is None and self._thread.is_alive():
                    self._cond.wait(0.05)
                self._raise_error()
            with self._tail_lock:
                need_tail = self._tail is None
            if need_tail and runs:  # no background thread: read the tail while the pool decodes
                self._read_whole_tail()
            tail_kgs: list[int] = []
            for i, run in enumerate(runs):
                if waves and waves[0][0][2] <= i:  # the next wave starts with this run's files
                    self._fetch_wave(waves.popleft(), fetcher)
                decoded = ahead.popleft().result()
                if i + DECODE_AHEAD < len(runs):
                    ahead.append(pool.submit(self._decode, runs[i + DECODE_AHEAD]))
                if self._raw_keys:  # a disk-backed working set: key group by key group, with its tail
                    prepared = self._entries(run, decoded)
                else:  # in memory: the base of a piece now, the tail once every base is in
                    prepared = [self._whole_run(run, decoded)]
                    tail_kgs.extend(run)
                del decoded
                with self._cond:
                    for kg in run:
                        self._state[kg] = _TAKEN
                    self._taken += len(run)
                yield from prepared
            if tail_kgs:  # one replay of the tail, as an eager restore does
                yield self._tail_part(tail_kgs)
            # the run the background thread was preparing when it was stopped
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join()
            yield from self.take_ready()
        except BaseException as e:
            self._fail(e)
            raise
        finally:
            fetcher.shutdown(wait=True, cancel_futures=True)
            pool.shutdown(wait=True, cancel_futures=True)

    def _units(self, kgs: list[int]) -> list[list[int]]:
        """``kgs`` (of one run) in pieces of about ``UNIT_ROWS`` rows (estimated from the rows
        of their files): what take_all decodes and turns into entries at a time, so that what
        is decoded ahead stays small when key groups are large (with row groups ending at key
        groups, docs/format.md section 9, a piece's rows are all a decoding reads)."""
        per_kg = sum(f.rows / max(1, len(f.key_groups)) for (_i, f, _m), _e in self._files_of.get(kgs[0], ()))
        size = max(1, int(UNIT_ROWS // per_kg)) if per_kg else len(kgs)
        return [kgs[i : i + size] for i in range(0, len(kgs), size)]

    def _fetch_waves(self, runs: list[list[int]]) -> collections.deque[list[tuple[_File, TableFile, int]]]:
        """The table files of ``runs`` not held yet, in order, as ``(entry, file, index of the
        first run needing it)``, cut into waves of at most ``FETCH_AHEAD_BYTES``."""
        waves: collections.deque[list[tuple[_File, TableFile, int]]] = collections.deque()
        seen: set[int] = set()
        size = 0
        for i, run in enumerate(runs):
            for (_info, f, _mine), entry in self._files_of.get(run[0], ()):
                if id(entry) in seen or entry.data is not None:
                    continue
                seen.add(id(entry))
                if not waves or size + f.bytes > FETCH_AHEAD_BYTES:
                    waves.append([])
                    size = 0
                waves[-1].append((entry, f, i))
                size += f.bytes
        return waves

    def _fetch_wave(self, wave: list[tuple[_File, TableFile, int]], fetcher: cf.Executor) -> None:
        """Start fetching ``wave``'s files. A fetch that fails leaves its file unfetched: the
        decoding that needs it fetches it again and raises the error (or, for a store that
        failed once, goes on)."""
        for entry, f, _i in wave:
            fetcher.submit(self._fetch_ahead, entry, f)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._ready.clear()
        self._touch_reader.drop_kept()
        with self._cond:
            pools, self._io = self._io, None
        for pool in pools or ():
            pool.shutdown(wait=True, cancel_futures=True)

    def _pools(self) -> tuple[cf.ThreadPoolExecutor, cf.ThreadPoolExecutor]:
        """``(requests, touch tails)``: the threads that read segments for a touch, and the
        one that reads a touched key group's tail with them (it waits for the first pool's
        threads, so it is not one of them)."""
        with self._cond:
            if self._io is None:
                self._io = (
                    cf.ThreadPoolExecutor(IO_THREADS, thread_name_prefix="statelog-ondemand-io"),
                    cf.ThreadPoolExecutor(1, thread_name_prefix="statelog-ondemand-touch"),
                )
            return self._io

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _fail(self, e: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = e
            self._cond.notify_all()

    # -- background thread ---------------------------------------------------------------------

    def _pause_for_task(self) -> None:
        """(A safe point of the background thread, which holds no lock there.) Wait while the
        task thread prepares a key group a record needs: both threads' Python work would share
        the GIL, and the record would wait twice as long (measured at 10^7 keys: the first
        record after 0.14-0.21 s with the background thread reading the whole tail meanwhile,
        0.05-0.10 s without it)."""
        if self._urgent and threading.current_thread() is self._thread:
            with self._cond:
                while self._urgent and not self._stop and self.error is None:
                    self._cond.wait(0.05)

    def _run(self) -> None:
        """Prepare the key groups in order, a run of key groups held by the same table files
        at a time (one decoding per file and run instead of one per key group)."""
        try:
            self._read_whole_tail()
        except BaseException as e:  # noqa: BLE001 - handed to the task thread, raised there
            self._fail(e)
            return
        with self._cond:
            self._cond.notify_all()  # a task thread in take_all waits for the tail
        for run in self._runs():
            if not self._background_step(run):
                return
        # key groups the task thread was loading by slices when their run came
        while True:
            with self._cond:
                while not self._stop and self.error is None:
                    partial = [kg for kg, st in self._state.items() if st == _PARTIAL]
                    if partial or _PREPARING not in self._state.values():
                        break
                    self._cond.wait(0.05)
                else:
                    return
            if not partial or not self._background_step(partial):
                return

    def _background_step(self, kgs: list[int]) -> bool:
        """Prepare what is left of ``kgs`` (a run of key groups held by the same table files, or
        key groups loaded by slices so far); False when the thread is to stop."""
        self._pause_for_task()
        with self._cond:
            while not self._stop and self.error is None and len(self._ready) >= self._read_ahead:
                self._cond.wait()
            if self._stop or self.error is not None:
                return False
            claimed = [kg for kg in kgs if self._state[kg] == _UNLOADED]
            partial = [kg for kg in kgs if self._state[kg] == _PARTIAL]
            for kg in claimed + partial:
                self._state[kg] = _PREPARING
        try:
            prepared = self._prepare_many(claimed) if claimed else []
            for kg in partial:
                self._pause_for_task()
                prepared.append(self._prepare_rest(kg))
        except BaseException as e:  # noqa: BLE001 - handed to the task thread, raised there
            self._fail(e)
            return False
        with self._cond:
            for p in prepared:
                self._ready[p.key_group] = p
                self._state[p.key_group] = _READY
            self._cond.notify_all()
        return True

    def _runs(self) -> list[list[int]]:
        """The key groups in order, cut where the set of table files holding them changes."""
        runs: list[list[int]] = []
        last: tuple[str, ...] | None = None
        for kg in self.key_groups:
            files = tuple(f.path for (_i, f, _m), _e in self._files_of.get(kg, ()))
            if not runs or files != last or not files or (self._max_run and len(runs[-1]) >= self._max_run):
                runs.append([])
            runs[-1].append(kg)
            last = files
        return runs

    # -- preparing key groups (either thread), slices of a key group ---------------------------

    def _slice_bounds(self, kg: int) -> list[bytes]:
        """The bounds of key group ``kg``'s slices (``[]``: it is loaded whole), from the row
        groups of its largest table file (by the thread that prepares ``kg``)."""
        bounds = self._bounds.get(kg)
        if bounds is None:
            bounds = []
            for (_info, f, _mine), entry in self._files_of.get(kg, ()):
                with entry.lock:
                    data = self._source(entry, f)
                b = key_slices(data, f, kg)
                if len(b) > len(bounds):
                    bounds = b
            self._bounds[kg] = bounds
        return bounds

    def _slice_of(self, kg: int, kb: bytes) -> int:
        return bisect.bisect_right(self._bounds[kg], kb)

    def _slice_range(self, kg: int, i: int) -> tuple[bytes | None, bytes | None]:
        bounds = self._bounds[kg]
        return (bounds[i - 1] if i > 0 else None, bounds[i] if i < len(bounds) else None)

    def _kg_tail(self, kg: int) -> Records:
        """The tail of key group ``kg``, kept while it is loaded by slices."""
        if self._whole_first:
            self._read_whole_tail()
        with self._tail_lock:
            tail = self._kg_tails.get(kg)
            if tail is not None:
                return tail
            if self._tail is not None:
                tail = self._tail.pop(kg, {})
            else:
                self._tail_alone.add(kg)
        if tail is None:
            tail = self._read_tail(KeyGroupRange(kg, kg)).get(kg, {})
        with self._tail_lock:
            self._kg_tails[kg] = tail
        return tail

    def _prepare_slice(self, kg: int, i: int, tail: cf.Future[Records] | None = None) -> PreparedKeyGroup:
        """Slice ``i`` of key group ``kg``: the row groups of its table files that may hold its
        keys, decoded, its rows and its share of the key group's tail (``tail``: being read)."""
        lo, hi = self._slice_range(kg, i)
        decoded = []
        for (info, f, _mine), entry in self._files_of.get(kg, ()):
            with entry.lock:
                data = self._source(entry, f)
            decoded.append((info, decode_key_range(data, f, kg, lo, hi, info)))
        kg_tail = self._kg_tail(kg) if tail is None else tail.result()
        return self._entries([kg], decoded, {kg: self._tail_of_slices(kg, kg_tail, {i}, True)})[0]

    def _prepare_rest(
        self, kg: int, tail: cf.Future[Records] | None = None, decoded: list[tuple[StateInfo, pa.Table]] | None = None
    ) -> PreparedKeyGroup:
        """What is left of key group ``kg`` after the slices handed out, all of it if none was
        (by the thread that holds it as _PREPARING; ``tail``: its tail, being read;
        ``decoded``: its rows, :meth:`_rest_rows`, if they were decoded already)."""
        taken = sorted(self._slices_taken.get(kg, ()))
        if decoded is None:
            decoded = self._rest_rows(kg)
        records = self._kg_tail(kg) if tail is None else tail.result()
        with self._tail_lock:
            self._kg_tails.pop(kg, None)
        if taken:
            records = self._tail_of_slices(kg, records, set(taken), False)
        return self._entries([kg], decoded, {kg: records})[0]

    def _rest_rows(self, kg: int) -> list[tuple[StateInfo, pa.Table]]:
        """The rows of key group ``kg`` without those of the slices handed out, decoded."""
        taken = sorted(self._slices_taken.get(kg, ()))
        decoded = self._decode([kg])
        if not taken:
            return decoded
        out = []
        for info, rows in decoded:
            keys = rows.column("key")
            drop = None
            for i in taken:
                m = key_range_mask(keys, *self._slice_range(kg, i))
                drop = m if drop is None else pc.or_(drop, m)
            out.append((info, rows.filter(pc.invert(drop))))
        return out

    def _tail_of_slices(self, kg: int, tail: Records, slices: set[int], inside: bool) -> Records:
        """The records of ``tail`` (key group ``kg``'s) whose key is in one of ``slices``
        (``inside``) or in none of them, in order."""
        bounds, bisect_right = self._bounds[kg], bisect.bisect_right
        out = {}
        for name, recs in tail.items():
            kept = [r for r in recs if (bisect_right(bounds, r[0]) in slices) is inside]
            if kept:
                out[name] = kept
        return out

    def _prepare_many(self, kgs: list[int]) -> list[PreparedKeyGroup]:
        """Prepare key groups held by the same table files (one key group, or a run's)."""
        decoded = self._decode(kgs)
        self._pause_for_task()
        return self._entries(kgs, decoded)

    def _source(self, entry: _File, f: TableFile) -> bytes | RangedTableFile:
        """What one key group (or a slice of it) is read from: the file's bytes if they are
        held, else, for a large file whose manifest entry has the checksums of its parts, the
        file read in ranges (its footer, then the row groups the key group needs: a first
        touch does not wait for a whole file), else the whole file fetched. Call it with
        ``entry.lock`` held."""
        if entry.data is not None or f.row_group_crc32 is None or f.bytes < RANGED_MIN_BYTES:
            return self._fetch(entry, f)
        if entry.ranged is None:
            entry.ranged = RangedTableFile(self.store, f, self._count_ranged)
            with self._stats_lock:
                self.files_ranged += 1
        return entry.ranged

    def _count_ranged(self, n: int) -> None:
        with self._stats_lock:
            self._file_bytes += n

    def _fetch(self, entry: _File, f: TableFile) -> bytes:
        """The verified bytes of a table file, fetched unless they are held (call it with
        ``entry.lock`` held)."""
        if entry.data is None:
            entry.data = fetch_table_file(self.store, f)
            with self._stats_lock:  # (fetch threads run this for different files at once)
                self._file_bytes += f.bytes
                self.files_fetched += 1
        return entry.data

    def _fetch_ahead(self, entry: _File, f: TableFile) -> None:
        with entry.lock:
            if entry.left > 0:  # (else every key group of it was decoded)
                self._fetch(entry, f)

    def _decode(self, kgs: list[int]) -> list[tuple[StateInfo, pa.Table]]:
        """The Arrow rows of ``kgs`` (held by the same table files) per file: fetching,
        verifying and Parquet decoding, which run mostly outside the GIL."""
        out = []
        for (info, f, _mine), entry in self._files_of.get(kgs[0], ()):
            self._pause_for_task()
            with entry.lock:
                # one key group: its row groups only, unless the file is held; a run: the file
                data = self._source(entry, f) if len(kgs) == 1 else self._fetch(entry, f)
                entry.left -= len(kgs)
                if entry.left == 0:
                    entry.data = entry.ranged = None  # its last key group: the file's memory goes
            holes = kgs[-1] - kgs[0] + 1 != len(kgs)  # a run with holes: only its own key groups
            rows = decode_table_file(data, f, KeyGroupRange(kgs[0], kgs[-1]), info, kgs if holes else None)
            out.append((info, rows))
        return out

    def _entries(
        self, kgs: list[int], decoded: list[tuple[StateInfo, pa.Table]], tails: dict[int, Records] | None = None
    ) -> list[PreparedKeyGroup]:
        """Keys, namespaces and entries of the decoded rows of ``kgs``, per key group, with their
        share of the tail (``tails``: given)."""
        out = {kg: PreparedKeyGroup(kg) for kg in kgs}
        for info, rows in decoded:
            for table, counts in _split(rows, kgs):
                if not table.num_rows:
                    continue
                self.check_keys(info.name, table.column("key"))
                keys, nss, values = base_entries(info, table, self._raw_keys)
                start = 0
                for kg, n in counts:
                    if n:
                        end = start + n
                        out[kg].base.setdefault(info.name, []).append((keys[start:end], nss[start:end], values[start:end]))
                        out[kg].rows += n
                        start = end
        if tails is None:
            tails = self._tails_of(kgs)
        for kg, p in out.items():
            p.records = tails.get(kg, {})
            self._count(p.rows, sum(len(r) for r in p.records.values()))
        return [out[kg] for kg in kgs]

    def _whole_run(self, kgs: list[int], decoded: list[tuple[StateInfo, pa.Table]]) -> PreparedKeyGroup:
        """A piece of a run as one part, without its tail (for a working set in memory, which
        does not need the key groups apart): keys and entries of each decoded table."""
        p = PreparedKeyGroup(kgs[0])
        for info, rows in decoded:
            if rows.num_rows:
                self.check_keys(info.name, rows.column("key"))
                p.base.setdefault(info.name, []).append(base_entries(info, rows))
                p.rows += rows.num_rows
        self._count(p.rows, 0)
        return p

    def _tail_part(self, kgs: list[int]) -> PreparedKeyGroup:
        """The tail records of ``kgs`` as one part, in key-group order (a key's records stay in
        their order: a key is in one key group), to install after their base entries."""
        p = PreparedKeyGroup(kgs[0] if kgs else self.key_groups.start)
        for tail in self._tails_of(kgs).values():
            for name, records in tail.items():
                p.records.setdefault(name, []).extend(records)
        self._count(0, sum(len(r) for r in p.records.values()))
        return p

    def _count(self, rows: int, records: int) -> None:
        with self._stats_lock:  # (both threads prepare key groups)
            self.rows += rows
            self.records += records

    def _tails_of(self, kgs: list[int]) -> dict[int, Records]:
        """The change records of key groups ``kgs``: from the whole tail once it was read (the
        background thread reads it first), else read for their range alone."""
        with self._tail_lock:
            if self._tail is not None:
                return {kg: self._tail.pop(kg, {}) for kg in kgs}
            self._tail_alone.update(kgs)
        tail = self._read_tail(KeyGroupRange(kgs[0], kgs[-1]))
        return {kg: tail.get(kg, {}) for kg in kgs}

    def _read_whole_tail(self) -> None:
        """Read the whole tail, once (by the first thread that needs it)."""
        with self._whole_lock:
            with self._tail_lock:
                if self._tail is not None:
                    return
            tail = self._read_tail(self.key_groups, whole=True)
            with self._tail_lock:
                for kg in self._tail_alone:  # read alone meanwhile (and handed out)
                    tail.pop(kg, None)
                self._tail = tail
        self._touch_reader.drop_kept()

    def _read_tail(self, kgr: KeyGroupRange, whole: bool = False) -> dict[int, Records]:
        """The change records of key groups ``kgr`` per key group and state, in order (the
        background thread's safe points between pieces of blocks). A segment is read whole
        for the ``whole`` tail; for some key groups, a segment over TOUCH_WHOLE_BYTES is read
        in ranges (its footer and the blocks of those key groups, format.md 4.2). The whole
        tail of a tail read whole first is read without safe points: a task thread may be
        waiting for it."""
        pause = not (whole and self._whole_first)
        if whole:
            reader, limit, pool = self._reader, WHOLE_OBJECT_LIMIT, None
        else:
            reader, limit, pool = self._touch_reader, TOUCH_WHOLE_BYTES, self._pools()[0]
        tail: dict[int, Records] = {}
        for r in self._ranges:
            sub = r.restrict(kgr)
            if sub is None:
                continue
            for batch in reader.read_range(sub.stream, sub.start, sub.end, sub.key_groups, sub.segments, limit, pool,
                                           IO_THREADS):  # fmt: skip
                for i in range(0, batch.table.num_rows, TAIL_PIECE_ROWS):
                    if pause:
                        self._pause_for_task()
                    piece = ChangeBatch(batch.state, batch.table.slice(i, TAIL_PIECE_ROWS))
                    for _seq, kg, op, kb, nsb, ukey, value, exp in piece.rows():
                        tail.setdefault(kg, {}).setdefault(batch.state, []).append((kb, nsb, op, ukey, value, exp))
        return tail
