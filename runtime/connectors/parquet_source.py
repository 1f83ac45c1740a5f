"""A source of Parquet files: one split per file of a directory.

The directory is local or ``s3://`` (read through the store layer:
:mod:`runtime.connectors.store_files`). Files are immutable, read one bounded batch at a
time; position ``{"offset": rows read}`` (a restore skips whole row groups by their footer
row counts, then slices inside the row group).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from runtime.connectors.sources import Source, SplitReader
from runtime.connectors.store_files import (
    StoreFile,
    list_names,
    open_store_file,
    source_store_options,
)
from runtime.errors import JobGraphError
from statelog.store import open_store


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
        self._groups = range(first, meta.num_row_groups)
        self._batches = (
            self.pf.iter_batches(PARQUET_BATCH_ROWS, row_groups=self._groups, columns=self.columns)
            if offset < self.total else iter(())
        )
        self._rows: int | None = None  # read_batch: rows decoded at a time (set by its first call)
        self._rest: pa.RecordBatch | None = None  # read_batch: what is left of the last decoded batch
        self._buf: list[Any] = []
        self._pos = 0
        self.finished = offset >= self.total

    def _next_arrow(self) -> pa.RecordBatch | None:
        """The next decoded batch (after the rows a restore skips); None at the end of the file."""
        while True:
            batch = next(self._batches, None)
            if batch is None:
                return None
            if self._skip:
                if batch.num_rows <= self._skip:
                    self._skip -= batch.num_rows
                    continue
                batch = batch.slice(self._skip)
                self._skip = 0
            if batch.num_rows:
                return batch

    def _next_batch(self) -> bool:
        """Decode and convert the next batch into the buffer; False at the end of the file."""
        while True:
            batch = self._next_arrow()
            if batch is None:
                return False
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
                self._ended()
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

    def read_batch(self, max_records: int) -> pa.RecordBatch | None:
        """Up to ``max_records`` rows as Arrow, sliced from the decoded batches (no Python
        object per row); batches of the file are decoded ``max_records`` rows at a time."""
        if self._rows is None:  # the first read decides how many rows the decoder yields at a time
            self._rows = max(PARQUET_BATCH_ROWS, max_records)
            if self.offset < self.total:
                self._batches = self.pf.iter_batches(self._rows, row_groups=self._groups, columns=self.columns)
        parts: list[pa.RecordBatch] = []
        got = 0
        while got < max_records and not self.finished:
            rest = self._rest
            if rest is None or rest.num_rows == 0:
                rest = self._next_arrow()
                if rest is None:
                    self._ended()
                    break
            take = rest.slice(0, max_records - got)
            self._rest = rest.slice(take.num_rows)
            parts.append(take)
            got += take.num_rows
            self.offset += take.num_rows
            if self.offset >= self.total:
                self.finished = True
        if len(parts) <= 1:
            return parts[0] if parts else None
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    def _ended(self) -> None:
        if self.offset != self.total:
            raise JobGraphError(
                f"{self.path}: ended after {self.offset} of {self.total} rows: the file changed; "
                "Parquet source files must not change after the job started"
            )
        self.finished = True

    def position(self) -> dict[str, Any]:
        return {"offset": self.offset}

    def close(self) -> None:
        self.pf.close()
        if isinstance(self.path, StoreFile):
            self.path.close()
