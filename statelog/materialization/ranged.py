"""A state table file read in verified ranges instead of whole.

The manifest records the CRC-32 of a table file's footer and of each row group
(docs/format.md section 9): :class:`RangedTableFile` fetches the footer first, then the row
groups a decode needs, each checked against the manifest, and Arrow reads the fetched parts
through a file-like adapter. An on-demand restore touching one key group of a large file
fetches that key group's row groups only.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from statelog.errors import CorruptionError, ObjectNotFoundError
from statelog.materialization.manifest import TableFile
from statelog.materialization.table_schema import row_group_span
from statelog.store.base import ObjectStore

RANGED_MIN_BYTES = 1 << 20  # a table file of this size or more may be read in ranges
FOOTER_READ_BYTES = 64 << 10  # the bytes Arrow reads first from a Parquet file's end


class RangedTableFile:
    """A table file read in verified parts: its footer first (the manifest's ``footer``
    checksum), then the row groups a reader needs (each against its CRC-32 in the manifest),
    by ranged reads; an on-demand restore touching one key group of a large file fetches that
    key group's row groups instead of the whole file. Thread-safe; pass it where a table
    file's verified bytes go (:func:`~statelog.materialization.table_reader.decode_table_file`,
    :func:`~statelog.materialization.key_slices.decode_key_range`,
    :func:`~statelog.materialization.key_slices.key_slices`)."""

    def __init__(self, store: ObjectStore, f: TableFile, on_fetch: Callable[[int], None] | None = None) -> None:
        """``on_fetch`` is called with the bytes of each read."""
        assert f.footer is not None and f.row_group_crc32 is not None
        self.store, self.f, self._on_fetch = store, f, on_fetch
        self._lock = threading.Lock()
        tail_bytes, crc = f.footer
        n = min(f.bytes, max(FOOTER_READ_BYTES, tail_bytes))
        tail = self._get(f.bytes - n, n)
        if tail_bytes > n or zlib.crc32(tail[n - tail_bytes:]) != crc:
            raise CorruptionError(f"state table {f.path}: its footer does not match the manifest's checksum; "
                                  "the file is corrupt", key=f.path)  # fmt: skip
        self._parts: list[tuple[int, bytes]] = [(f.bytes - n, tail)]
        self._verified: set[int] = set()
        self.metadata = pq.ParquetFile(pa.PythonFile(_Parts(self), mode="r")).metadata  # parsed from the footer
        if self.metadata.num_row_groups != len(f.row_group_crc32):
            raise CorruptionError(f"state table {f.path}: {self.metadata.num_row_groups} row groups, the "
                                  f"manifest lists {len(f.row_group_crc32)}; the file is corrupt", key=f.path)  # fmt: skip

    def reader(self) -> pq.ParquetFile:
        """A Parquet reader of the parts fetched, for one thread: Arrow's reader pre-buffers the
        row groups a read asks for in a cache of its own, which a read from another thread
        would replace; each decode opens one (with the footer already parsed)."""
        return pq.ParquetFile(pa.PythonFile(_Parts(self), mode="r"), metadata=self.metadata,
                              page_checksum_verification=True)  # fmt: skip

    def _get(self, offset: int, length: int) -> bytes:
        try:
            data = self.store.get_range(self.f.path, offset, length)
        except ObjectNotFoundError:
            raise self.f.missing(self.store) from None
        if len(data) != length:
            raise CorruptionError(f"state table {self.f.path}: shorter than the manifest's {self.f.bytes} bytes",
                                  key=self.f.path)  # fmt: skip
        if self._on_fetch is not None:
            self._on_fetch(length)
        return data

    def need(self, groups: Iterable[int]) -> None:
        """Fetch and verify row groups ``groups`` unless held (adjacent ones in one read)."""
        md = self.metadata
        with self._lock:
            todo = sorted(set(groups) - self._verified)
            runs: list[list[int]] = []
            for i in todo:
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            for run in runs:
                spans = [row_group_span(md, i) for i in run]
                start, end = spans[0][0], spans[-1][1]
                data = self._get(start, end - start)
                for i, (a, b) in zip(run, spans, strict=True):
                    if zlib.crc32(data[a - start : b - start]) != self.f.row_group_crc32[i]:
                        raise CorruptionError(f"state table {self.f.path}: row group {i} does not match the "
                                              "manifest's checksum; the file is corrupt", key=self.f.path)  # fmt: skip
                self._parts.append((start, data))
                self._verified.update(run)

    def read(self, offset: int, n: int) -> bytes:
        """Bytes ``[offset, offset + n)`` from the parts fetched (Arrow reads several row
        groups at once: a read may span parts fetched apart)."""
        out, pos, end = [], offset, offset + n
        for start, data in sorted(self._parts, key=lambda p: p[0]):
            stop = start + len(data)
            if start <= pos < stop:
                out.append(data[pos - start : min(end, stop) - start])
                pos = min(end, stop)
                if pos == end:
                    return out[0] if len(out) == 1 else b"".join(out)
        if n == 0:
            return b""
        raise RuntimeError(f"state table {self.f.path}: bytes {offset}+{n} read before they were fetched")


class _Parts:
    """The Python file Arrow reads a :class:`RangedTableFile` through (fetched parts only)."""

    closed = False

    def __init__(self, owner: RangedTableFile) -> None:
        self._owner, self._pos = owner, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def size(self) -> int:
        return self._owner.f.bytes

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self._pos + pos if whence == 1 else self._owner.f.bytes + pos
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self._owner.f.bytes - self._pos
        data = self._owner.read(self._pos, n)
        self._pos += n
        return data

