"""Sources with rewindable positions, and watermark strategies.

A source is split into **splits** (partitions) with stable ids. The job master enumerates
them and assigns split ``k`` (in sorted order) to source subtask ``k % parallelism``, so a
restore at another parallelism redistributes them. A :class:`SplitReader` reads one split
from a position, a small JSON-able dict that checkpoints record per split (in the
checkpoint's ``sources``) and that restores rewind to:

* :class:`GeneratorSource`: ``fn(split, index)`` for ``index`` in ``0..count-1`` of every
  split; position ``{"next": index}``. Deterministic, so the golden output of a job is known.
* :class:`FileSource`: one split per file (``*.jsonl`` by default, one JSON value per line)
  of a directory; append-only files; position ``{"offset": records read, "byte": byte offset}``.
* :class:`ParquetSource`: one split per Parquet file of a directory (local, or ``s3://``
  through the store layer: :mod:`runtime.store_files`); immutable files, read one bounded
  batch at a time; position ``{"offset": rows read}`` (a restore skips whole row groups by
  their footer row counts, then slices inside the row group).

All accept ``records_per_s`` (per source subtask) to pace a job, e.g. in tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from runtime.errors import JobGraphError
from runtime.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.store_files import StoreFile, list_names, open_store_file, source_store_options
from statelog.store import open_store


@dataclass(frozen=True)
class WatermarkStrategy:
    """Event timestamps from ``timestamp_fn(value)`` (int ms) and bounded out-of-orderness
    watermarks: ``max timestamp seen - max_out_of_orderness_ms - 1`` per split, the minimum
    over the subtask's unfinished splits."""

    timestamp_fn: Callable[[Any], int]
    max_out_of_orderness_ms: int = 0

    @staticmethod
    def for_bounded_out_of_orderness(timestamp_fn: Callable[[Any], int], max_out_of_orderness_ms: int) -> WatermarkStrategy:
        return WatermarkStrategy(timestamp_fn, max_out_of_orderness_ms)

    @staticmethod
    def for_monotonous_timestamps(timestamp_fn: Callable[[Any], int]) -> WatermarkStrategy:
        return WatermarkStrategy(timestamp_fn, 0)


class SplitReader:
    """Reads one split sequentially from a position."""

    finished = False

    def read(self, max_records: int) -> list[Any]:
        raise NotImplementedError

    def position(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Source:
    """Base of sources: enumerates splits (in the driver) and reads them (in workers)."""

    records_per_s: float | None = None

    def splits(self) -> list[str]:
        raise NotImplementedError

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        raise NotImplementedError

    def open_splits(
        self,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
        *,
        subtask: int = 0,
        parallelism: int = 1,
        restored: bool = False,
    ) -> SourceSplits:
        """The reading side of source subtask ``subtask`` (in a worker): ``assigned`` maps its
        splits to their restored positions (``None``: from the start); ``restored`` says the job
        restored positions of this source. Sources that read their splits together (Kafka: one
        consumer) return their own :class:`SourceSplits`."""
        return SourceSplits(self, assigned, watermarks)


# -- generator -----------------------------------------------------------------------------------


class GeneratorSource(Source):
    """``count`` records per split: record ``i`` of split ``k`` is ``fn(k, i)``.

    ``count=None`` makes it unbounded.
    """

    def __init__(
        self,
        fn: Callable[[int, int], Any],
        count: int | None,
        splits: int = 1,
        records_per_s: float | None = None,
    ) -> None:
        if count is not None and (type(count) is not int or count < 0):
            raise JobGraphError(f"GeneratorSource count must be an int >= 0 or None, got {count!r}")
        if type(splits) is not int or splits < 1:
            raise JobGraphError(f"GeneratorSource splits must be an int >= 1, got {splits!r}")
        self.fn = fn
        self.count = count
        self.n_splits = splits
        self.records_per_s = records_per_s

    def splits(self) -> list[str]:
        return [f"{k:04d}" for k in range(self.n_splits)]

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        return _GeneratorReader(self.fn, int(split), self.count, int((position or {}).get("next", 0)))


class _GeneratorReader(SplitReader):
    def __init__(self, fn: Callable[[int, int], Any], split: int, count: int | None, start: int) -> None:
        self.fn, self.split, self.count, self.next = fn, split, count, start
        self.finished = count is not None and start >= count

    def read(self, max_records: int) -> list[Any]:
        stop = self.next + max_records
        if self.count is not None:
            stop = min(stop, self.count)
        fn, k = self.fn, self.split
        out = [fn(k, i) for i in range(self.next, stop)]
        self.next = stop
        if self.count is not None and stop >= self.count:
            self.finished = True
        return out

    def position(self) -> dict[str, Any]:
        return {"next": self.next}


# -- files ---------------------------------------------------------------------------------------


class FileSource(Source):
    """JSON lines files of a directory, one split per file (matched by ``pattern``).

    Files are append-only: a restore seeks to the recorded byte offset. With
    ``bounded=True`` a split finishes at the end of its file (a last line without newline
    counts); otherwise it waits for more lines (files appearing later are not discovered).
    ``parse`` turns one line (bytes, without newline) into a record (default ``json.loads``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        pattern: str = "*.jsonl",
        *,
        bounded: bool = True,
        parse: Callable[[bytes], Any] | None = None,
        records_per_s: float | None = None,
    ) -> None:
        self.directory = str(directory)
        self.pattern = pattern
        self.bounded = bounded
        self.parse = parse
        self.records_per_s = records_per_s

    def splits(self) -> list[str]:
        d = Path(self.directory)
        if not d.is_dir():
            raise JobGraphError(f"FileSource directory {self.directory} does not exist")
        return sorted(p.name for p in d.glob(self.pattern) if p.is_file())

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        pos = position or {}
        return _FileReader(
            Path(self.directory) / split, int(pos.get("offset", 0)), int(pos.get("byte", 0)),
            self.bounded, self.parse or json.loads,
        )


class _FileReader(SplitReader):
    def __init__(self, path: Path, offset: int, byte: int, bounded: bool, parse: Callable[[bytes], Any]) -> None:
        self.path, self.offset, self.byte, self.bounded, self.parse = path, offset, byte, bounded, parse
        self.f = open(path, "rb")  # noqa: SIM115 - kept open while the split is read
        size = os.fstat(self.f.fileno()).st_size
        if byte > size:
            raise JobGraphError(
                f"{path}: the restored position (byte {byte}) is past the end of the file ({size} bytes); "
                "source files must be append-only"
            )
        self.f.seek(byte)

    def read(self, max_records: int) -> list[Any]:
        out: list[Any] = []
        f, parse = self.f, self.parse
        while len(out) < max_records:
            line = f.readline()
            if not line:
                if self.bounded:
                    self.finished = True
                break
            if not line.endswith(b"\n"):
                if not self.bounded:  # a line being appended: read it again later
                    f.seek(self.byte)
                    break
                self.finished = True
            self.byte += len(line)
            self.offset += 1
            body = line.rstrip(b"\r\n")
            if body:
                out.append(parse(body))
            if self.finished:
                break
        return out

    def position(self) -> dict[str, Any]:
        return {"offset": self.offset, "byte": self.byte}

    def close(self) -> None:
        self.f.close()


class ParquetSource(Source):
    """Parquet files of a directory, one split per file (matched by ``pattern``, sorted).

    Files are immutable once visible and bounded: a split finishes at the file's last row.
    ``columns`` selects and orders the columns (default: all, in file order); ``row="dict"``
    makes each row a ``{column: value}`` dict, ``row="tuple"`` a tuple in column order (the
    fast path). The position is ``{"offset": rows read}``; a restore skips whole row groups
    by the row counts of the file's footer and slices inside the row group it lands in.

    ``directory`` may be ``s3://bucket/prefix`` (the objects directly below it, read with
    ranged GETs through statelog's store layer, so every node of a cluster reaches them);
    ``store_options`` then configures the store (else the ``AWS_*`` environment of the
    process that builds the source: resolved here, they travel with the pickled source).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        pattern: str = "*.parquet",
        *,
        columns: list[str] | tuple[str, ...] | None = None,
        row: str = "dict",
        records_per_s: float | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise JobGraphError(f"ParquetSource directory must be a path, got {directory!r}")
        if not isinstance(pattern, str) or not pattern:
            raise JobGraphError(f"ParquetSource pattern must be a non-empty glob such as '*.parquet', got {pattern!r}")
        if row not in ("dict", "tuple"):
            raise JobGraphError(f"ParquetSource row must be 'dict' or 'tuple', got {row!r}")
        if columns is not None:
            if isinstance(columns, str) or not isinstance(columns, (list, tuple)) or not columns:
                raise JobGraphError(
                    f"ParquetSource columns must be a non-empty list of column names or None (all columns), got {columns!r}"
                )
            bad = [c for c in columns if not isinstance(c, str)]
            if bad:
                raise JobGraphError(f"ParquetSource columns must be strings, got {bad!r}")
            dups = sorted({c for c in columns if list(columns).count(c) > 1})
            if dups:
                raise JobGraphError(f"ParquetSource columns lists {dups} more than once; name each column once")
        if records_per_s is not None and (
            isinstance(records_per_s, bool) or not isinstance(records_per_s, (int, float)) or not records_per_s > 0
        ):
            raise JobGraphError(f"ParquetSource records_per_s must be > 0 or None (unpaced), got {records_per_s!r}")
        self.directory = str(directory)
        self.store_options = source_store_options("ParquetSource", self.directory, store_options)
        self.pattern = pattern
        self.columns = list(columns) if columns is not None else None
        self.row = row
        self.records_per_s = records_per_s

    def _file(self, name: str) -> Path | StoreFile:
        if self.store_options is None:
            return Path(self.directory) / name
        return open_store_file(self.directory, self.store_options, name)

    def splits(self) -> list[str]:
        if self.store_options is not None:
            store = open_store(self.directory, self.store_options)
            try:
                names = list_names(store, self.pattern)
            finally:
                store.close()
            for name in names:  # fail early: every file is Parquet with the columns (footers only)
                f = self._file(name)
                try:
                    _select_columns(f, _open_parquet(f), self.columns)
                finally:
                    f.close()
            return names
        d = Path(self.directory)
        if not d.is_dir():
            raise JobGraphError(f"ParquetSource directory {self.directory} does not exist")
        names = sorted(p.name for p in d.glob(self.pattern) if p.is_file())
        for name in names:  # fail early, in the job master: every file is Parquet with the columns
            pf = _open_parquet(d / name)
            try:
                _select_columns(d / name, pf, self.columns)
            finally:
                pf.close()
        return names

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        offset = int((position or {}).get("offset", 0))
        return _ParquetReader(self._file(split), offset, self.columns, self.row)


PARQUET_BATCH_ROWS = 4096  # rows decoded and converted at a time


def _open_parquet(path: Path | StoreFile) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise JobGraphError(
            f"{path}: the Parquet file is gone; Parquet source files must stay unchanged while a job "
            "(or a checkpoint to restore) reads them"
        ) from None
    except (pa.ArrowException, OSError) as e:
        raise JobGraphError(
            f"{path} is not a valid Parquet file ({e}); remove it or narrow the source's pattern"
        ) from None


def _select_columns(path: Path | StoreFile, pf: pq.ParquetFile, columns: list[str] | None) -> list[str]:
    names = list(pf.schema_arrow.names)
    if columns is None:
        return names
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise JobGraphError(f"{path} has no column(s) {unknown}; its columns are {names}")
    return columns


class _ParquetReader(SplitReader):
    def __init__(self, path: Path | StoreFile, offset: int, columns: list[str] | None, row: str) -> None:
        self.path, self.offset, self.row = path, offset, row
        try:
            self.pf = _open_parquet(path)
        except BaseException:
            if isinstance(path, StoreFile):
                path.close()
            raise
        try:
            self.columns = _select_columns(path, self.pf, columns)
            meta = self.pf.metadata
            self.total = meta.num_rows
            if offset < 0 or offset > self.total:
                raise JobGraphError(
                    f"{path}: the restored position (row {offset}) is past the end of the file "
                    f"({self.total} rows): the file changed; Parquet source files must not change "
                    "after the job started"
                )
            # skip whole row groups by their footer row counts
            first, start = 0, 0
            while first < meta.num_row_groups and start + meta.row_group(first).num_rows <= offset:
                start += meta.row_group(first).num_rows
                first += 1
        except BaseException:
            self.close()
            raise
        self._skip = offset - start  # rows to drop inside the first row group read
        self._batches = (
            self.pf.iter_batches(PARQUET_BATCH_ROWS, row_groups=range(first, meta.num_row_groups), columns=self.columns)
            if offset < self.total else iter(())
        )
        self._buf: list[Any] = []
        self._pos = 0
        self.finished = offset >= self.total

    def _next_batch(self) -> bool:
        """Decode and convert the next batch into the buffer; False at the end of the file."""
        while True:
            batch = next(self._batches, None)
            if batch is None:
                return False
            if self._skip:
                if batch.num_rows <= self._skip:
                    self._skip -= batch.num_rows
                    continue
                batch = batch.slice(self._skip)
                self._skip = 0
            if batch.num_rows == 0:
                continue
            cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            if self.row == "tuple":
                self._buf = list(zip(*cols, strict=True))
            else:
                names = self.columns
                self._buf = [dict(zip(names, vals, strict=True)) for vals in zip(*cols, strict=True)]
            self._pos = 0
            return True

    def read(self, max_records: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < max_records and not self.finished:
            if self._pos >= len(self._buf) and not self._next_batch():
                if self.offset != self.total:
                    raise JobGraphError(
                        f"{self.path}: ended after {self.offset} of {self.total} rows: the file changed; "
                        "Parquet source files must not change after the job started"
                    )
                self.finished = True
                break
            take = self._buf[self._pos : self._pos + max_records - len(out)]
            self._pos += len(take)
            self.offset += len(take)
            out.extend(take)
            if self.offset >= self.total:
                self.finished = True
        if self.finished:
            self._buf = []
        return out

    def position(self) -> dict[str, Any]:
        return {"offset": self.offset}

    def close(self) -> None:
        self.pf.close()
        if isinstance(self.path, StoreFile):
            self.path.close()


# -- the source side of a task ------------------------------------------------------------------


class SourceSplits:
    """The splits one source subtask reads: round-robin batches, timestamps, watermarks."""

    def __init__(
        self,
        source: Source,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
    ) -> None:
        self.source = source
        self.watermarks = watermarks
        self.readers: dict[str, SplitReader] = {}
        self.max_ts: dict[str, int] = {}
        for split, pos in sorted(assigned.items()):
            self.readers[split] = source.reader(split, pos)
            if pos is not None and "max_ts" in pos:
                self.max_ts[split] = int(pos["max_ts"])
        self._order = list(self.readers)
        self._next = 0
        self.emitted = 0

    @property
    def finished(self) -> bool:
        return all(r.finished for r in self.readers.values())

    def read(self, max_records: int) -> list[tuple[Any, int | None]]:
        """Up to ``max_records`` records ``(value, timestamp)`` of the next unfinished split."""
        n = len(self._order)
        for _ in range(n):
            split = self._order[self._next % n]
            self._next += 1
            r = self.readers[split]
            if r.finished:
                continue
            values = r.read(max_records)
            if not values:
                continue
            self.emitted += len(values)
            ws = self.watermarks
            if ws is None:
                return [(v, None) for v in values]
            tsf = ws.timestamp_fn
            out = [(v, tsf(v)) for v in values]
            hi = max(ts for _, ts in out)
            if hi > self.max_ts.get(split, MIN_WATERMARK):
                self.max_ts[split] = hi
            return out
        return []

    def watermark(self) -> int:
        """The subtask's watermark: the minimum over unfinished splits (MAX when all finished)."""
        if self.watermarks is None:
            return MAX_WATERMARK if self.finished else MIN_WATERMARK
        lag = self.watermarks.max_out_of_orderness_ms + 1
        wm = MAX_WATERMARK
        for split, r in self.readers.items():
            if r.finished:
                continue
            ts = self.max_ts.get(split)
            wm = min(wm, MIN_WATERMARK if ts is None else ts - lag)
        return wm

    def snapshot_positions(self, checkpoint_id: int) -> dict[str, dict[str, Any]]:
        """The positions recorded in checkpoint ``checkpoint_id`` (at its barrier)."""
        return self.positions()

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed (e.g. Kafka commits its offsets for monitoring)."""

    def positions(self) -> dict[str, dict[str, Any]]:
        out = {}
        for split, r in self.readers.items():
            pos = dict(r.position())
            if split in self.max_ts:
                pos["max_ts"] = self.max_ts[split]
            out[split] = pos
        return out

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
