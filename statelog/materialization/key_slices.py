"""One key group of a table file read a slice of keys at a time.

A large key group has row groups of its own (:func:`~statelog.materialization.table_schema.row_group_bounds`),
each with statistics on ``key``: their smallest keys cut the key group into slices of about a
row group each, and an on-demand restore loads the slice a record's key falls in instead of
the whole key group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import booleans, integer_numpy
from statelog.descriptors import StateInfo
from statelog.errors import CorruptionError
from statelog.materialization.manifest import TableFile
from statelog.materialization.ranged import RangedTableFile
from statelog.materialization.table_reader import need_row_groups, of_state, open_verified


def key_slices(data: bytes | RangedTableFile, f: TableFile, kg: int) -> list[bytes]:
    """The smallest keys of the row groups that hold key group ``kg`` alone, but the first:
    bounds that cut the key group's keys into slices of about a row group each (an on-demand
    restore loads a slice, :func:`decode_key_range`, instead of the whole key group). Empty
    when the file has fewer than two such row groups, or no statistics on ``key``."""
    pf = open_verified(data, f)
    md, ki = pf.metadata, pf.schema_arrow.get_field_index("key")
    mins = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        st, ks = rg.column(0).statistics, rg.column(ki).statistics
        if st is None or not st.has_min_max or not (st.min == st.max == kg):
            continue
        if ks is None or not ks.has_min_max:
            return []
        mins.append(ks.min)
    return sorted(mins)[1:]


def key_range_mask(keys: Any, lo: bytes | None, hi: bytes | None) -> np.ndarray:
    """``lo <= key < hi`` (``None``: unbounded) of a binary key column, bytewise, as a numpy
    array of bools. (Compared in Python, a row group's keys at a time: Arrow's comparison
    kernels would import pandas on their first call, 0.2-0.3 s of a restarted process's
    first record.)"""
    ks = keys.to_pylist()
    if lo is None and hi is None:
        return np.ones(len(ks), bool)
    return np.fromiter(((lo is None or k >= lo) and (hi is None or k < hi) for k in ks), bool, len(ks))


def decode_key_range(
    data: bytes | RangedTableFile, f: TableFile, kg: int, lo: bytes | None, hi: bytes | None, info: StateInfo | None = None
) -> pa.Table:
    """The rows of key group ``kg`` with ``lo <= key < hi`` (``None``: unbounded) of a table
    file's verified bytes: only the row groups that may hold them are decoded (by the
    statistics of ``key_group`` and ``key``; a row group without them is decoded and
    filtered); Parquet page checksums are checked."""
    pf = open_verified(data, f)
    try:
        md, ki = pf.metadata, pf.schema_arrow.get_field_index("key")
        groups = []
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            st = rg.column(0).statistics
            if st is not None and st.has_min_max:
                if not (st.min <= kg <= st.max):
                    continue
                ks = rg.column(ki).statistics
                known = st.min == st.max and ks is not None and ks.has_min_max  # its keys' range
                if known and ((hi is not None and ks.min >= hi) or (lo is not None and ks.max < lo)):
                    continue
            groups.append(i)
        need_row_groups(data, groups)
        table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
        mask = key_range_mask(table.column("key"), lo, hi) & (integer_numpy(table.column("key_group")) == kg)
        table = table.filter(booleans(mask))
    except (OSError, pa.ArrowException) as e:
        raise CorruptionError(f"state table {f.path} cannot be read: {e}", key=f.path) from None
    return of_state(table, f, info)
