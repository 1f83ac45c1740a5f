"""Verified reads of state table files: whole, or the rows of some key groups.

A table file's bytes are checked against the size and CRC-32 its manifest recorded (or,
read in ranges, its footer and row groups against theirs: :mod:`statelog.materialization.ranged`);
decoding checks the Parquet page checksums and reads only the row groups whose key-group
statistics overlap the key groups asked for.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from statelog.arrays import integer_numpy, take_table
from statelog.descriptors import StateInfo
from statelog.errors import CorruptionError, ObjectNotFoundError
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import TableFile
from statelog.materialization.ranged import RangedTableFile
from statelog.materialization.table_schema import META_STATE
from statelog.store.base import ObjectStore


def _holds_any(sorted_kgs: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_left(sorted_kgs, lo)
    return i < len(sorted_kgs) and sorted_kgs[i] <= hi


def _holds_all(sorted_kgs: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_left(sorted_kgs, lo)
    return i + (hi - lo) < len(sorted_kgs) and sorted_kgs[i + (hi - lo)] == hi and sorted_kgs[i] == lo


def read_table_file(
    store: ObjectStore, f: TableFile, kgr: KeyGroupRange, info: StateInfo | None = None
) -> pa.Table:
    """Read one verified table file, only the row groups overlapping ``kgr``, rows filtered to it."""
    return decode_table_file(fetch_table_file(store, f), f, kgr, info)


def fetch_table_file(store: ObjectStore, f: TableFile) -> bytes:
    """The bytes of a table file, checked against the size and CRC-32 its manifest recorded."""
    try:
        data = store.get_expected(f.path, f.bytes, f.crc32)  # a local copy only if it matches these
    except ObjectNotFoundError:
        raise f.missing(store) from None
    if len(data) != f.bytes or zlib.crc32(data) != f.crc32:
        raise CorruptionError(
            f"state table {f.path}: size or CRC-32 does not match the manifest; the file is corrupt",
            key=f.path,
        )
    return data


def need_row_groups(data: bytes | RangedTableFile, groups: Iterable[int]) -> None:
    """Fetch row groups ``groups`` of a ranged file before a decode reads them (whole
    files' bytes hold every row group)."""
    if isinstance(data, RangedTableFile):
        data.need(groups)


def decode_table_file(
    data: bytes | RangedTableFile, f: TableFile, kgr: KeyGroupRange, info: StateInfo | None = None,
    only: list[int] | None = None,
) -> pa.Table:
    """The rows of ``kgr`` (with ``only``: of those sorted key groups of it) of a table file's
    verified bytes; only the row groups holding them are decoded; Parquet page checksums are
    checked."""
    pf = open_verified(data, f)
    try:
        inter = f.key_groups.intersect(kgr)
        if inter == f.key_groups and only is None:
            need_row_groups(data, range(pf.metadata.num_row_groups))
            table = pf.read()
        else:
            groups = []
            exact = True  # every row of the row groups read is wanted: no filter needed
            md = pf.metadata
            for i in range(md.num_row_groups):
                st = md.row_group(i).column(0).statistics
                if st is None or not st.has_min_max:
                    groups.append(i)
                    exact = False
                elif kgr.overlaps(st.min, st.max) and (only is None or _holds_any(only, st.min, st.max)):
                    groups.append(i)
                    exact = exact and kgr.start <= st.min and st.max <= kgr.end and (
                        only is None or _holds_all(only, st.min, st.max)
                    )
            need_row_groups(data, groups)
            table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
            if not exact:
                kg = integer_numpy(table.column("key_group"))  # (numpy: no pyarrow.compute on a first key group)
                if only is None:
                    table = take_table(table, np.flatnonzero((kg >= kgr.start) & (kg <= kgr.end)))
                else:
                    table = take_table(table, np.flatnonzero(np.isin(kg, np.asarray(only, np.int64))))
    except (OSError, pa.ArrowException) as e:
        raise CorruptionError(f"state table {f.path} cannot be read: {e}", key=f.path) from None
    return of_state(table, f, info)


def of_state(table: pa.Table, f: TableFile, info: StateInfo | None) -> pa.Table:
    """``table``, refused unless it holds the rows of state ``info`` (when given)."""
    if table.num_rows != 0 and info is not None and table.schema.metadata.get(META_STATE) != info.name.encode():
        raise CorruptionError(f"state table {f.path} does not hold state {info.name!r}", key=f.path)
    return table


def open_verified(data: bytes | RangedTableFile, f: TableFile) -> pq.ParquetFile:
    """A Parquet reader of a table file's verified bytes that checks page checksums."""
    if isinstance(data, RangedTableFile):
        return data.reader()
    try:
        return pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:
        raise CorruptionError(f"state table {f.path} cannot be read: {e}", key=f.path) from None

