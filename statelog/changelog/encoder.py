"""Batch encoder: change records (in a record layout) to Arrow batches, and batches to blocks.

:meth:`BlockEncoder.encode_batch` converts the columns of one state's records (narrow or
full layout, :mod:`statelog.changelog.records`) to a record batch of the block schema;
:meth:`BlockEncoder.write_block` serializes the batches of one stream as one compressed,
checksummed block (``docs/format.md`` section 4), which
:func:`statelog.changelog.format.decode_block` verifies and reads back.
"""

from __future__ import annotations

import pickle
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statelog.changelog.format import (
    COMPRESS_MIN_ROWS,
    META_STATE,
    SPLIT_BLOCK_ROWS,
    SPLIT_MIN_ROWS,
    Codec,
    block_schema,
)
from statelog.changelog.records import (
    C_KEY,
    C_KG,
    C_NS,
    C_OP,
    N_VALUE,
    NARROW_WIDTH,
    W_EXPIRES,
    W_UKEY,
    W_VALUE,
)
from statelog.compute import pc
from statelog.types import PICKLE, ValueType, arrow_type, to_arrow


class BlockEncoder:
    """Encodes batches of change records into compressed, checksummed blocks."""

    def __init__(self, level: int = 1, codec: Codec | str = Codec.ZSTD) -> None:
        # Arrow's own IPC body compression runs in C++ without holding the GIL, so the
        # flusher's compression overlaps with the task thread on another core. One core:
        # with use_threads Arrow compresses the buffers of a batch on its whole CPU pool,
        # which on a small machine takes the task thread's core too.
        codec = Codec(codec)  # statelog.options.engine.WriterOptions checks the user's option
        self._ipc_options = (
            None
            if codec is Codec.NONE
            else pa.ipc.IpcWriteOptions(
                compression=pa.Codec("zstd", compression_level=level) if codec is Codec.ZSTD else pa.Codec("lz4"),
                use_threads=False,
            )
        )
        self._schemas: dict[tuple, Any] = {}

    def encode_batch(
        self,
        state: str,
        value_type: ValueType,
        user_key_type: ValueType | None,
        is_list: bool,
        seqs: list[int] | tuple[int, int],
        cols: list[Any],
        kg_range: tuple[int, int] | None = None,
    ) -> EncodedBatch:
        """Convert records given as columns (narrow or wide layout) to Arrow.

        ``seqs`` is a list of sequence numbers or ``(first, count)`` for contiguous ones. A
        column is a list of Python values or an Arrow array of its stored type (columns from
        :func:`narrow_columns`). ``kg_range`` is ``(min, max)`` of the key groups when known.
        """
        n = len(cols[C_KEY])
        narrow = len(cols) == NARROW_WIDTH
        skey = (state, id(value_type), id(user_key_type), is_list)
        cached = self._schemas.get(skey)
        if cached is None:
            schema = block_schema(value_type, user_key_type, is_list)
            schema = schema.with_metadata({**schema.metadata, META_STATE: state.encode()})
            self._schemas[skey] = (schema, value_type, user_key_type)  # keep the types alive
        else:
            schema = cached[0]
        if isinstance(seqs, tuple):
            first, count = seqs
            seq_arr = _seq(first, count)
            last = first + count - 1
        else:
            seq_arr = pa.array(seqs, pa.int64())
            first, last = seqs[0], seqs[-1]
        kgs = _array(cols[C_KG], pa.uint16())
        values = cols[N_VALUE if narrow else W_VALUE]
        if isinstance(values, pa.Array):
            value_arr = values
        elif is_list:
            if value_type is PICKLE:
                dumps = pickle.dumps
                values = [None if v is None else [dumps(x, protocol=5) for x in v] for v in values]
            value_arr = pa.array(values, pa.list_(arrow_type(value_type)))
        else:
            value_arr = to_arrow(values, value_type)
        if user_key_type is None or narrow:
            ukey_arr = _nulls(n, schema.field("user_key").type)
        else:
            ukey_arr = to_arrow(cols[W_UKEY], user_key_type)
        batch = pa.record_batch(
            [
                seq_arr,
                kgs,
                _column(cols[C_OP], pa.uint8()),
                _array(cols[C_KEY], pa.binary()),
                _column(cols[C_NS], pa.binary()),
                ukey_arr,
                value_arr,
                _nulls(n, pa.int64()) if narrow else _column(cols[W_EXPIRES], pa.int64()),
            ],
            schema=schema,
        )
        if kg_range is None:
            mm = pc.min_max(kgs)
            kg_range = (mm["min"].as_py(), mm["max"].as_py())
        return EncodedBatch(batch, first, last, kg_range[0], kg_range[1])

    def write_block(self, batches: list[EncodedBatch]) -> tuple[bytes, int, int]:
        """Serialize the batches of one (stream, state) as one block.

        Returns ``(stored_bytes, uncompressed_data_bytes, crc32)``.
        """
        schema = batches[0].batch.schema
        rows = sum(b.batch.num_rows for b in batches)
        # compression has a fixed cost per buffer; small blocks are stored uncompressed
        compress = rows >= COMPRESS_MIN_ROWS and self._ipc_options is not None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema, options=self._ipc_options if compress else None) as w:
            # one call for all batches: every write call releases the GIL, and getting it back
            # from a busy task thread can take a switch interval (5 ms)
            w.write_table(pa.Table.from_batches([b.batch for b in batches], schema))
        stored = sink.getvalue().to_pybytes()
        raw = sum(batch_nbytes(b.batch) for b in batches) if compress else len(stored)
        return stored, raw, zlib.crc32(stored)


@dataclass(frozen=True)
class EncodedBatch:
    """Change records of one state converted to Arrow, waiting to be written into a block."""

    batch: pa.RecordBatch
    first_seq: int
    last_seq: int
    kg_min: int
    kg_max: int


def split_by_key_group(
    batches: list[EncodedBatch], min_rows: int = SPLIT_MIN_ROWS, block_rows: int = SPLIT_BLOCK_ROWS
) -> list[list[EncodedBatch]]:
    """The batches of one stream's records in a segment, as the contents of its blocks.

    From ``min_rows`` rows on, the records are split into blocks of about ``block_rows``
    rows (the writer options ``split_min_rows`` and ``split_block_rows``), each
    holding every record of a range of key groups (the ranges are disjoint and ascending; a
    key group is never split), the records of each block in sequence order: a reader of one
    key group decodes one block of the segment instead of all its records (segment version
    2, ``docs/format.md`` 4.2). Fewer rows, or one key group: one block, as given.
    """
    rows = sum(b.batch.num_rows for b in batches)
    if rows < min_rows or min(b.kg_min for b in batches) == max(b.kg_max for b in batches):
        return [batches]
    table = pa.Table.from_batches([b.batch for b in batches])
    kg = table.column(1).to_numpy()  # uint16
    counts = np.bincount(kg)
    # greedily, in key-group order: a block ends once it holds the rows per block, and a key
    # group with that many rows alone is a block of its own
    target = rows / -(-rows // block_rows)
    starts: list[int] = []  # the first key group of each block but the first
    acc = 0
    for g in np.flatnonzero(counts).tolist():
        c = int(counts[g])
        if acc and (acc >= target or c >= target):
            starts.append(g)
            acc = 0
        acc += c
    if not starts:
        return [batches]
    lut = np.zeros(len(counts), np.uint16)  # key group -> block
    for i, g in enumerate(starts):
        lut[g:] = i + 1
    block = lut[kg]
    # stable (a radix sort for 16-bit values): each block's rows stay in sequence order
    order = np.argsort(block, kind="stable")
    sorted_table = table.take(pa.array(order))
    seq = sorted_table.column(0).to_numpy()
    sizes = np.bincount(block, minlength=len(starts) + 1)
    out: list[list[EncodedBatch]] = []
    start = 0
    for size in sizes.tolist():
        if not size:
            continue
        end = start + size
        part = sorted_table.slice(start, size).combine_chunks().to_batches()[0]
        kgs = kg[order[start:end]]
        out.append([EncodedBatch(part, int(seq[start]), int(seq[end - 1]), int(kgs.min()), int(kgs.max()))])
        start = end
    return out


_IOTA: list[pa.Array] = []  # built on first use: pa.array() imports pandas (through pyarrow)
_NONE_NS = b"\x00"  # the serialized default namespace (None)
_CONSTANTS: dict[tuple[Any, Any], pa.Array] = {}


_ARANGE = getattr(pa, "arange", None)  # pyarrow >= 19


def _seq(first: int, count: int) -> pa.Array:
    """``[first, first + 1, ..., first + count - 1]`` as int64."""
    if _ARANGE is not None:
        return _ARANGE(first, first + count)
    return pc.add(_iota(count), pa.scalar(first, pa.int64()))


_NULLS: dict[tuple[int, pa.DataType], pa.Array] = {}


def _nulls(n: int, type_: pa.DataType) -> pa.Array:
    """``pa.nulls(n, type_)``, cached per length and type (the batch size recurs)."""
    key = (n, type_)
    a = _NULLS.get(key)
    if a is None:
        if len(_NULLS) >= 64:
            _NULLS.clear()
        a = _NULLS[key] = pa.nulls(n, type_)
    return a


def batch_nbytes(batch: pa.RecordBatch) -> int:
    """``batch.nbytes`` (the bytes of the buffer ranges its columns reference), computed
    directly for the column types of change records; other types ask Arrow, whose
    ``nbytes`` builds a table of byte ranges (tens of microseconds per batch)."""
    total = 0
    for a in batch.columns:
        kind = _NBYTES_KIND.get(a.type)
        if kind is None:
            kind = _NBYTES_KIND[a.type] = _nbytes_kind(a.type)
        if kind == 0:  # null: no buffers
            continue
        if kind == -1:
            total += a.nbytes
            continue
        off, n = a.offset, len(a)
        if kind == 1:  # binary: int32 offsets + the referenced values
            total += 4 * n + a.total_values_length
        else:  # fixed width, ``kind`` bits per value
            total += (off * kind + n * kind + 7) // 8 - off * kind // 8
        if a.buffers()[0] is not None:  # validity bitmap: the bytes covering bits [off, off + n)
            total += (off % 8 + n + 7) // 8
    return total


_NBYTES_KIND: dict[pa.DataType, int] = {}


def _nbytes_kind(t: pa.DataType) -> int:
    if pa.types.is_null(t):
        return 0
    if pa.types.is_binary(t):
        return 1
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return t.bit_width
    return -1


def _iota(n: int) -> pa.Array:
    """``[0, 1, ..., n-1]`` as int64 (a zero-copy slice of a cached array)."""
    if not _IOTA or n > len(_IOTA[0]):
        size = max(n, 2 * len(_IOTA[0]) if _IOTA else 1 << 16)
        _IOTA[:] = [pa.array(np.arange(size, dtype=np.int64))]
    return _IOTA[0].slice(0, n)


def _array(values: list[Any] | pa.Array, type_: pa.DataType) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, type_)


def _column(values: list[Any] | pa.Array, type_: pa.DataType) -> pa.Array:
    """An Arrow array of ``values``; constant columns (the common case) are cached slices."""
    if isinstance(values, pa.Array):
        return values
    n = len(values)
    if n and values.count(values[0]) == n:
        v = values[0]
        if v is None:
            return pa.nulls(n, type_)
        if not (v == _NONE_NS or (type(v) is int and 0 <= v < 16)):
            return pa.repeat(pa.scalar(v, type_), n)  # e.g. a window namespace: not cached
        key = (v, type_)
        const = _CONSTANTS.get(key)
        if const is None or len(const) < n:
            const = pa.repeat(pa.scalar(v, type_), max(n, 1 << 12))
            _CONSTANTS[key] = const
        return const.slice(0, n)
    return pa.array(values, type_)
