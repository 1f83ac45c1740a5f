"""The state table format (``statelog.state-table.v1``, docs/format.md section 9).

One state's table is Parquet sorted by ``(key_group, key, namespace)``: the schema (columns
by state kind, schema metadata naming the state), state entries as rows and back (shared by
the writer and the restore path), the row-group layout (a large key group in row groups of
its own, so a reader of one key group decodes no neighbour's rows) and the encoding.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from statelog.arrays import integer_numpy
from statelog.changelog.format import TIMER_STATES
from statelog.compute import pc
from statelog.descriptors import StateInfo, StateKind
from statelog.types import PICKLE, arrow_type

# the Parquet schema metadata keys
META_FORMAT = b"statelog.table"
META_STATE = b"statelog.state"
META_KIND = b"statelog.kind"
META_VALUE_ENC = b"statelog.value_encoding"
META_UKEY_ENC = b"statelog.user_key_encoding"
TABLE_FORMAT = b"statelog.state-table.v1"


def _elem_type(t: Any) -> pa.DataType:
    return pa.binary() if t is PICKLE else arrow_type(t)


def table_schema(info: StateInfo) -> pa.Schema:
    """The Parquet schema of one state's table."""
    base = [pa.field("key_group", pa.int32(), nullable=False), pa.field("key", pa.binary(), nullable=False),
            pa.field("namespace", pa.binary(), nullable=False)]
    meta = {META_FORMAT: TABLE_FORMAT, META_STATE: info.name.encode(), META_KIND: info.kind.value.encode()}
    if info.value_type is PICKLE:
        meta[META_VALUE_ENC] = b"pickle"
    if info.name in TIMER_STATES:
        fields = [*base, pa.field("timestamp", pa.int64(), nullable=False)]
        meta[META_KIND] = b"timers"
    elif info.kind is StateKind.LIST:
        fields = [*base, pa.field("value", pa.list_(_elem_type(info.value_type))),
                  pa.field("expires_ms", pa.list_(pa.int64()))]
    elif info.kind is StateKind.MAP:
        assert info.user_key_type is not None
        if info.user_key_type is PICKLE:
            meta[META_UKEY_ENC] = b"pickle"
        fields = [*base, pa.field("value", pa.map_(_elem_type(info.user_key_type), _elem_type(info.value_type))),
                  pa.field("expires_ms", pa.list_(pa.int64()))]
    else:
        fields = [*base, pa.field("value", _elem_type(info.value_type)), pa.field("expires_ms", pa.int64())]
    return pa.schema(fields, metadata=meta)


def _dump(v: Any) -> bytes:
    return pickle.dumps(v, protocol=5)


def image_to_table(info: StateInfo, rows: Iterable[tuple[tuple[int, bytes, bytes], Any]]) -> pa.Table:
    """Build a state table from ``((key_group, key, namespace), entry)`` pairs in sorted order.

    Entries: value-like ``(value, expires)``; list ``[(value, expires), ...]``; map
    ``{user_key: (value, expires)}``; timers: the row key is ``(kg, key, ns, timestamp)``
    and the entry is ignored.
    """
    schema = table_schema(info)
    kgs: list[int] = []
    kbs: list[bytes] = []
    nss: list[bytes] = []
    if info.name in TIMER_STATES:
        tss: list[int] = []
        for (kg, kb, nsb, ts), _ in rows:
            kgs.append(kg)
            kbs.append(kb)
            nss.append(nsb)
            tss.append(ts)
        cols = [pa.array(tss, pa.int64())]
    else:
        values: list[Any] = []
        exps: list[Any] = []
        pickled = info.value_type is PICKLE
        ttl = info.ttl is not None
        if info.kind is StateKind.LIST:
            for (kg, kb, nsb), entry in rows:
                kgs.append(kg)
                kbs.append(kb)
                nss.append(nsb)
                vs = [e[0] for e in entry]
                values.append([_dump(v) for v in vs] if pickled else vs)
                exps.append([e[1] for e in entry] if ttl else None)
        elif info.kind is StateKind.MAP:
            ukp = info.user_key_type is PICKLE
            for (kg, kb, nsb), entry in rows:
                kgs.append(kg)
                kbs.append(kb)
                nss.append(nsb)
                values.append([(_dump(k) if ukp else k, _dump(e[0]) if pickled else e[0]) for k, e in entry.items()])
                exps.append([e[1] for e in entry.values()] if ttl else None)
        else:
            for (kg, kb, nsb), entry in rows:
                kgs.append(kg)
                kbs.append(kb)
                nss.append(nsb)
                values.append(_dump(entry[0]) if pickled else entry[0])
                exps.append(entry[1])
        cols = [pa.array(values, schema.field("value").type), pa.array(exps, schema.field("expires_ms").type)]
    arrays = [pa.array(kgs, pa.int32()), pa.array(kbs, pa.binary()), pa.array(nss, pa.binary()), *cols]
    return pa.Table.from_arrays(arrays, schema=schema)


def table_to_image(info: StateInfo, table: pa.Table) -> Iterator[tuple[tuple, Any]]:
    """Inverse of :func:`image_to_table`."""
    kgs = table.column("key_group").to_pylist()
    kbs = table.column("key").to_pylist()
    nss = table.column("namespace").to_pylist()
    if info.name in TIMER_STATES:
        for kg, kb, nsb, ts in zip(kgs, kbs, nss, table.column("timestamp").to_pylist(), strict=True):
            yield (kg, kb, nsb, ts), None
        return
    values = decode_values(info, table)
    exps = table.column("expires_ms").to_pylist()
    if info.kind is StateKind.LIST:
        for kg, kb, nsb, vs, xs in zip(kgs, kbs, nss, values, exps, strict=True):
            yield (kg, kb, nsb), list(zip(vs, xs if xs is not None else [None] * len(vs), strict=True))
    elif info.kind is StateKind.MAP:
        for kg, kb, nsb, m, xs in zip(kgs, kbs, nss, values, exps, strict=True):
            items = list(m.items())
            xs = xs if xs is not None else [None] * len(items)
            yield (kg, kb, nsb), {k: (v, x) for (k, v), x in zip(items, xs, strict=True)}
    else:
        for kg, kb, nsb, v, x in zip(kgs, kbs, nss, values, exps, strict=True):
            yield (kg, kb, nsb), (v, x)


def decode_values(info: StateInfo, table: pa.Table) -> list[Any]:
    """The ``value`` column as Python objects (lists as lists, maps as dicts, pickles loaded)."""
    col = table.column("value")
    pickled = info.value_type is PICKLE
    if info.kind is StateKind.LIST:
        vs = col.to_pylist()
        return [[pickle.loads(x) for x in v] for v in vs] if pickled else vs
    if info.kind is StateKind.MAP:
        ukp = info.user_key_type is PICKLE
        out = []
        for items in col.to_pylist():
            out.append({
                (pickle.loads(k) if ukp else k): (pickle.loads(v) if pickled else v) for k, v in items
            })
        return out
    vs = col.to_pylist()
    if pickled:
        return [pickle.loads(v) for v in vs]
    if pa.types.is_map(col.type):
        return [None if v is None else dict(v) for v in vs]
    return vs


MIN_ROW_GROUP_ROWS = 4_096  # row groups end at a key group's end once they hold this many rows
ROW_GROUP_ROWS = 16_384  # at most this many rows per row group


def row_group_bounds(
    key_groups: np.ndarray, max_rows: int = ROW_GROUP_ROWS, min_rows: int = MIN_ROW_GROUP_ROWS
) -> list[tuple[int, int]]:
    """``[start, end)`` row ranges of the row groups of a table sorted by key group: a key
    group of ``min_rows`` rows or more has row groups of its own, of at most ``max_rows`` rows
    each (a reader of that key group alone decodes none of its neighbours' rows, and an
    on-demand restore can load it a row group at a time); smaller key groups share row groups,
    each ending at a key group's end once it holds ``min_rows`` rows."""
    n = len(key_groups)
    ends = [*(np.flatnonzero(np.diff(key_groups)) + 1).tolist(), n] if n else []
    out: list[tuple[int, int]] = []
    start = 0  # of the rows not in a row group yet
    prev = 0  # the end of the previous key group
    for end in ends:
        if end - prev >= min_rows and prev > start:  # a large key group: the small ones before it apart
            out.append((start, prev))
            start = prev
        if end - start >= min_rows or end == n:
            while end - start > max_rows:
                out.append((start, start + max_rows))
                start += max_rows
            if end > start:
                out.append((start, end))
            start = end
        prev = end
    return out


def encode_parquet(
    table: pa.Table, row_group_rows: int = ROW_GROUP_ROWS, min_row_group_rows: int = MIN_ROW_GROUP_ROWS
) -> bytes:
    """A state table's Parquet bytes (docs/format.md section 9); ``table`` sorted by key group,
    in row groups of :func:`row_group_bounds` (the ``MaterializeOptions`` of the same names)."""
    # dictionary-encode keys only where they repeat (several namespaces per key, e.g.
    # windows): unique keys in a dictionary cost 3x the bytes and 1.6x the read time
    dictionary = ["namespace"]
    if table.num_rows and pc.count_distinct(table.column("key")).as_py() * 2 <= table.num_rows:
        dictionary.append("key")
    buf = io.BytesIO()
    with pq.ParquetWriter(
        buf, table.schema, compression="zstd", compression_level=1, write_page_checksum=True,
        write_statistics=["key_group", "key"], use_dictionary=dictionary,
    ) as writer:  # fmt: skip
        bounds = row_group_bounds(integer_numpy(table.column("key_group")), row_group_rows, min_row_group_rows)
        for start, end in bounds or [(0, 0)]:
            writer.write_table(table.slice(start, end - start), row_group_size=max(1, end - start))
    return buf.getvalue()

def row_group_span(md: pq.FileMetaData, i: int) -> tuple[int, int]:
    """``[start, end)`` of row group ``i``'s bytes in its file (its column chunks, pages and
    dictionary pages included), from the file's metadata."""
    rg = md.row_group(i)
    start, end = None, 0
    for c in range(rg.num_columns):
        cc = rg.column(c)
        first = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
        start = first if start is None else min(start, first)
        end = max(end, first + cc.total_compressed_size)
    return start or 0, end
