"""The state-table files of an on-demand restore, per key group.

Each file is fetched and verified against the size and CRC-32 its manifest recorded once,
its bytes kept until its last key group was prepared; each preparation decodes only the row
groups of its key groups. A first touch of a large file reads it in ranges (its footer, then
the row groups it needs) instead of waiting for the whole file. A file with a table image in
the local copies (``statelog.materialization.table_image``) is read from it instead: its
rows with the keys decoded, nothing to fetch or decode.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
from collections.abc import Callable

import pyarrow as pa

from statelog.descriptors import StateInfo
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import TableFile
from statelog.materialization.ranged import RangedTableFile
from statelog.materialization.table_image import image_rows, load_image
from statelog.materialization.table_reader import decode_table_file, fetch_table_file
from statelog.restore.changes import BaseFile
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.store.base import ObjectStore

__all__ = ["FileEntry", "TableFiles"]


class FileEntry:
    """A table file being read for its key groups: fetched and verified once, its bytes kept
    until its last key group was prepared; each preparation decodes only the row groups of
    its key groups."""

    __slots__ = ("lock", "data", "left", "ranged", "image", "image_tried")

    def __init__(self, left: int) -> None:
        self.lock = threading.Lock()
        self.data: bytes | None = None
        self.left = left
        self.ranged: RangedTableFile | None = None  # its footer and the row groups read so far
        self.image: pa.Table | None = None  # its rows from its table image in the local copies
        self.image_tried = False


# a wave of table files take_all fetches at once: (entry, file, index of the first run needing it)
Wave = list[tuple[FileEntry, TableFile, int]]


class TableFiles:
    """The table files holding each key group, fetched or read in ranges once, decoded by key
    groups (either thread; the fetch threads of take_all)."""

    def __init__(
        self,
        store: ObjectStore,
        files: list[BaseFile],
        key_groups: KeyGroupRange,
        options: OnDemandOptions,
        pause: Callable[[], None],
        max_run: int | None = None,
    ) -> None:
        self.store = store
        self.key_groups = key_groups
        self._options = options
        self._pause = pause  # the background thread's safe point (Progress.pause_for_task)
        self._max_run = max_run
        self.of: dict[int, list[tuple[BaseFile, FileEntry]]] = {}
        for info, f, kgr in files:
            mine = f.key_groups.intersect(kgr)
            if mine is None:
                continue
            entry = FileEntry(len(mine))
            for kg in mine:
                self.of.setdefault(kg, []).append(((info, f, mine), entry))
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.fetched = 0  # whole
        self.ranged = 0  # read in ranges (some of them fetched whole later)

    @property
    def empty(self) -> bool:
        """No table file holds any of the key groups (the state is a tail only)."""
        return not self.of

    def runs(self) -> list[list[int]]:
        """The key groups in order, cut where the set of table files holding them changes."""
        runs: list[list[int]] = []
        last: tuple[str, ...] | None = None
        for kg in self.key_groups:
            files = tuple(f.path for (_i, f, _m), _e in self.of.get(kg, ()))
            if not runs or files != last or not files or (self._max_run and len(runs[-1]) >= self._max_run):
                runs.append([])
            runs[-1].append(kg)
            last = files
        return runs

    def units(self, kgs: list[int]) -> list[list[int]]:
        """``kgs`` (of one run) in pieces of about ``unit_rows`` rows (estimated from the rows
        of their files): what take_all decodes and turns into entries at a time, so that what
        is decoded ahead stays small when key groups are large (with row groups ending at key
        groups, docs/format.md section 9, a piece's rows are all a decoding reads)."""
        per_kg = sum(f.rows / max(1, len(f.key_groups)) for (_i, f, _m), _e in self.of.get(kgs[0], ()))
        size = max(1, int(self._options.unit_rows // per_kg)) if per_kg else len(kgs)
        return [kgs[i : i + size] for i in range(0, len(kgs), size)]

    def waves(self, runs: list[list[int]]) -> collections.deque[Wave]:
        """The table files of ``runs`` not held yet, in order, as ``(entry, file, index of the
        first run needing it)``, cut into waves of at most ``fetch_ahead_bytes``."""
        waves: collections.deque[Wave] = collections.deque()
        seen: set[int] = set()
        size = 0
        limit = self._options.fetch_ahead_bytes
        for i, run in enumerate(runs):
            for (_info, f, _mine), entry in self.of.get(run[0], ()):
                if id(entry) in seen or entry.data is not None or entry.image is not None:
                    continue
                seen.add(id(entry))
                if not waves or size + f.bytes > limit:
                    waves.append([])
                    size = 0
                waves[-1].append((entry, f, i))
                size += f.bytes
        return waves

    def fetch_wave(self, wave: Wave, fetcher: cf.Executor) -> None:
        """Start fetching ``wave``'s files. A fetch that fails leaves its file unfetched: the
        decoding that needs it fetches it again and raises the error (or, for a store that
        failed once, goes on)."""
        for entry, f, _i in wave:
            fetcher.submit(self._fetch_ahead, entry, f)

    def source(self, entry: FileEntry, f: TableFile) -> bytes | RangedTableFile:
        """What one key group (or a slice of it) is read from: the file's bytes if they are
        held, else, for a large file whose manifest entry has the checksums of its parts, the
        file read in ranges (its footer, then the row groups the key group needs: a first
        touch does not wait for a whole file), else the whole file fetched. Call it with
        ``entry.lock`` held."""
        if entry.data is not None or f.row_group_crc32 is None or f.bytes < self._options.ranged_min_bytes:
            return self.fetch(entry, f)
        if entry.ranged is None:
            entry.ranged = RangedTableFile(self.store, f, self._count_ranged)
            with self._lock:
                self.ranged += 1
        return entry.ranged

    def _count_ranged(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n

    def fetch(self, entry: FileEntry, f: TableFile) -> bytes:
        """The verified bytes of a table file, fetched unless they are held (call it with
        ``entry.lock`` held)."""
        if entry.data is None:
            entry.data = fetch_table_file(self.store, f)
            with self._lock:  # (fetch threads run this for different files at once)
                self.bytes_read += f.bytes
                self.fetched += 1
        return entry.data

    def image(self, entry: FileEntry, f: TableFile) -> pa.Table | None:
        """The file's rows from its table image in the local copies (decoded int64 keys, read
        once), or ``None`` when it has none (call it with ``entry.lock`` held)."""
        if not entry.image_tried:
            entry.image_tried = True
            entry.image = load_image(self.store, f)
            if entry.image is not None:
                with self._lock:  # (counted as the file it stands for, as an eager restore does)
                    self.bytes_read += f.bytes
                    self.fetched += 1
        return entry.image

    def _fetch_ahead(self, entry: FileEntry, f: TableFile) -> None:
        with entry.lock:
            if entry.left > 0 and self.image(entry, f) is None:  # (left 0: every key group of it was decoded)
                self.fetch(entry, f)

    def decode(self, kgs: list[int]) -> list[tuple[StateInfo, pa.Table]]:
        """The Arrow rows of ``kgs`` (held by the same table files) per file: fetching,
        verifying and Parquet decoding, which run mostly outside the GIL."""
        out = []
        for (info, f, _mine), entry in self.of.get(kgs[0], ()):
            self._pause()
            with entry.lock:
                image = self.image(entry, f)
                data = None
                if image is None:  # one key group: its row groups only, unless the file is held; a run: the file
                    data = self.source(entry, f) if len(kgs) == 1 else self.fetch(entry, f)
                entry.left -= len(kgs)
                if entry.left == 0:
                    entry.data = entry.ranged = entry.image = None  # its last key group: the file's memory goes
            holes = kgs[-1] - kgs[0] + 1 != len(kgs)  # a run with holes: only its own key groups
            span = KeyGroupRange(kgs[0], kgs[-1])
            if image is not None:
                rows = image_rows(image, span, kgs if holes else None)
            else:
                assert data is not None
                rows = decode_table_file(data, f, span, info, kgs if holes else None)
            out.append((info, rows))
        return out
