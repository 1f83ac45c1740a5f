"""The changelog tail of an on-demand restore, split by key group.

The background thread reads the whole tail first (:meth:`TailReader.read_whole`) and splits
it by key group; a key group needed before that reads its own records alone (the reader
filters blocks by key group before decoding rows, and keeps the segments it read whole, and
their decoded blocks, for the next key groups), unless the tail is one of small segments
(``segment_read_cost_bytes`` per segment at most): then the first thread that needs a part of
it reads it whole, once.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from statelog.changelog.reader import WHOLE_OBJECT_LIMIT, ChangeBatch, SegmentReader
from statelog.checkpoint.metadata import ChangelogRange
from statelog.keys.groups import KeyGroupRange
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.store.base import ObjectStore

__all__ = ["Records", "TailReader"]

Record = tuple[bytes, bytes, int, Any, Any, int | None]  # key bytes, namespace bytes, op, user key, value, expires
Records = dict[str, list[Record]]  # per state, in order


class TailReader:
    """Reads the change records of an on-demand restore's changelog ranges per key group:
    the whole tail once, or a key group's records alone until then."""

    def __init__(
        self,
        store: ObjectStore,
        ranges: list[ChangelogRange],
        key_groups: KeyGroupRange,
        options: OnDemandOptions,
        pause: Callable[[], None],
    ) -> None:
        self.ranges = ranges
        self.key_groups = key_groups
        self._options = options
        self._pause = pause  # the background thread's safe point (Progress.pause_for_task)
        # one reader for the whole tail (segments read whole) and one for the tails of key
        # groups read alone (larger segments read in ranges), each caching the footers it read;
        # the second keeps the decoded blocks of the segments it read whole (a tail of many small
        # segments, one per checkpoint, is then read once, not once per key group touched) until
        # the whole tail is in
        self.reader = SegmentReader(store)
        self.touch_reader = SegmentReader(store, keep_bytes=options.touch_keep_bytes,
                                          tail_read_bytes=options.tail_read_bytes)
        # a tail of many small segments (one per checkpoint since the last materialization,
        # say) is read whole once, by the first thread that needs a part of it, instead
        segments = {s.name: s.size for r in ranges for s in r.segments}
        self.whole_first = sum(segments.values()) <= options.segment_read_cost_bytes * len(segments)
        self.whole: dict[int, Records] | None = None  # the whole tail by key group, once read
        self.lock = threading.Lock()
        self._alone: set[int] = set()  # key groups whose records were read alone
        self._kept: dict[int, Records] = {}  # the tail of each key group being loaded by slices
        self._whole_lock = threading.Lock()
        # a touch's requests: its tail's segments (io_threads at once), read by a helper thread
        # while the task thread reads the key group's table files
        self._io: tuple[cf.ThreadPoolExecutor, cf.ThreadPoolExecutor] | None = None
        self._io_lock = threading.Lock()

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read + self.touch_reader.bytes_read

    def of(self, kgs: list[int]) -> dict[int, Records]:
        """The change records of key groups ``kgs``: from the whole tail once it was read (the
        background thread reads it first), else read for their range alone."""
        with self.lock:
            if self.whole is not None:
                return {kg: self.whole.pop(kg, {}) for kg in kgs}
            self._alone.update(kgs)
        tail = self._read(KeyGroupRange(kgs[0], kgs[-1]))
        return {kg: tail.get(kg, {}) for kg in kgs}

    def of_key_group(self, kg: int) -> Records:
        """The tail of key group ``kg``, kept while it is loaded by slices (until :meth:`release`)."""
        if self.whole_first:
            self.read_whole()
        with self.lock:
            tail = self._kept.get(kg)
            if tail is not None:
                return tail
            if self.whole is not None:
                tail = self.whole.pop(kg, {})
            else:
                self._alone.add(kg)
        if tail is None:
            tail = self._read(KeyGroupRange(kg, kg)).get(kg, {})
        with self.lock:
            self._kept[kg] = tail
        return tail

    def read_soon(self, kg: int) -> cf.Future[Records]:
        """:meth:`of_key_group` in a helper thread (a first touch reads its table files meanwhile)."""
        return self._pools()[1].submit(self.of_key_group, kg)

    def release(self, kg: int) -> None:
        """Key group ``kg`` is prepared whole: its kept tail goes."""
        with self.lock:
            self._kept.pop(kg, None)

    def read_whole(self) -> None:
        """Read the whole tail, once (by the first thread that needs it)."""
        with self._whole_lock:
            with self.lock:
                if self.whole is not None:
                    return
            tail = self._read(self.key_groups, whole=True)
            with self.lock:
                for kg in self._alone:  # read alone meanwhile (and handed out)
                    tail.pop(kg, None)
                self.whole = tail
        self.touch_reader.drop_kept()

    def _read(self, kgr: KeyGroupRange, whole: bool = False) -> dict[int, Records]:
        """The change records of key groups ``kgr`` per key group and state, in order (the
        background thread's safe points between pieces of blocks). A segment is read whole
        for the ``whole`` tail; for some key groups, a segment over ``touch_whole_bytes`` is
        read in ranges (its footer and the blocks of those key groups, format.md 4.2). The
        whole tail of a tail read whole first is read without safe points: a task thread may
        be waiting for it."""
        pause = not (whole and self.whole_first)
        opts = self._options
        if whole:
            reader, limit, pool = self.reader, WHOLE_OBJECT_LIMIT, None
        else:
            reader, limit, pool = self.touch_reader, opts.touch_whole_bytes, self._pools()[0]
        piece_rows = opts.tail_piece_rows
        tail: dict[int, Records] = {}
        for r in self.ranges:
            sub = r.restrict(kgr)
            if sub is None:
                continue
            for batch in reader.read_range(sub.stream, sub.start, sub.end, sub.key_groups, sub.segments, limit, pool,
                                           opts.io_threads):  # fmt: skip
                for i in range(0, batch.table.num_rows, piece_rows):
                    if pause:
                        self._pause()
                    piece = ChangeBatch(batch.state, batch.table.slice(i, piece_rows))
                    for kg, records in _by_key_group(piece):
                        tail.setdefault(kg, {}).setdefault(batch.state, []).extend(records)
        return tail

    def _pools(self) -> tuple[cf.ThreadPoolExecutor, cf.ThreadPoolExecutor]:
        """``(requests, touch tails)``: the threads that read segments for a touch, and the
        one that reads a touched key group's tail with them (it waits for the first pool's
        threads, so it is not one of them)."""
        with self._io_lock:
            if self._io is None:
                self._io = (
                    cf.ThreadPoolExecutor(self._options.io_threads, thread_name_prefix="statelog-ondemand-io"),
                    cf.ThreadPoolExecutor(1, thread_name_prefix="statelog-ondemand-touch"),
                )
            return self._io

    def close(self) -> None:
        self.touch_reader.drop_kept()
        with self._io_lock:
            pools, self._io = self._io, None
        for pool in pools or ():
            pool.shutdown(wait=True, cancel_futures=True)


def _by_key_group(batch: ChangeBatch) -> Iterator[tuple[int, list[Record]]]:
    """The records of ``batch`` per key group, each key group's in their order (a stable sort
    by key group: one list per key group, not a dictionary lookup per record)."""
    _seq, kgs, ops, kbs, nss, ukeys, values, exps = batch.columns()
    records = list(zip(kbs, nss, ops, ukeys, values, exps, strict=True))
    if not records:
        return
    first = kgs[0]
    if kgs.count(first) == len(kgs):
        yield first, records
        return
    groups = np.asarray(kgs, dtype=np.int64)
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.diff(sorted_groups)) + 1
    bounds = [0, *starts.tolist(), len(records)]
    order_list = order.tolist()
    for a, b in itertools.pairwise(bounds):
        yield int(sorted_groups[a]), [records[j] for j in order_list[a:b]]
