"""Batch encoder: change records (in a record layout) to Arrow batches, and batches to blocks.

:meth:`BlockEncoder.encode_batch` converts the columns of one state's records (narrow or
full layout, :mod:`statelog.changelog.records`) to a record batch of the block schema;
:meth:`BlockEncoder.write_block` serializes the batches of one stream as one compressed,
checksummed block (``docs/format.md`` section 4), :meth:`BlockEncoder.write_blocks` the blocks
of one stream in a segment with the same bytes in one Arrow call, which
:func:`statelog.changelog.format.decode_block` verifies and reads back.
"""

from __future__ import annotations

import pickle
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statelog import _ext
from statelog.arrays import numpy_integers
from statelog.changelog.format import (
    COMPRESS_MIN_ROWS,
    IPC_EOS,
    META_STATE,
    SPLIT_BLOCK_ROWS,
    SPLIT_MIN_ROWS,
    Codec,
    block_schema,
    ipc_message_ends,
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

# the checksums of a segment's blocks in one call without the GIL (statelog/_ext/fastpath.c)
_crc32_ranges = getattr(_ext.load("fastpath"), "crc32_ranges", None)
_kg_blocks = getattr(_ext.load("fastpath"), "kg_blocks", None)


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
        compress = self._compresses(batches)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema, options=self._ipc_options if compress else None) as w:
            # one call for all batches: every write call releases the GIL, and getting it back
            # from a busy task thread can take a switch interval (5 ms)
            w.write_table(pa.Table.from_batches([b.batch for b in batches], schema))
        stored = sink.getvalue().to_pybytes()
        raw = sum(batch_nbytes(b.batch) for b in batches) if compress else len(stored)
        return stored, raw, zlib.crc32(stored)

    def write_blocks(self, blocks: list[list[EncodedBatch]]) -> list[tuple[list[Any], int, int, int]]:
        """Serialize several blocks of one (stream, state), each as :meth:`write_block` would:
        ``(pieces, stored_length, uncompressed_data_bytes, crc32)`` per block, its stored bytes
        being ``b"".join(pieces)``.

        The blocks that compress are written in one Arrow IPC call and checksummed in one
        call without the GIL (``fastpath.crc32_ranges``): each block is that stream's schema
        message, the block's batch messages and the end-of-stream marker, the bytes
        :meth:`write_block` writes. The flusher then takes the GIL back a few times per
        segment instead of a few times per block; each take can wait for a task thread's long
        C call (a batch fold of 50-100 ms), which made a flusher of 128 blocks per segment the
        bottleneck of a task at 10^7 keys (docs/performance.md, "Columnar")."""
        out: list[Any] = [None] * len(blocks)
        flags = [self._compresses(bl) for bl in blocks]
        compressed = [i for i, c in enumerate(flags) if c]
        plain = [i for i, c in enumerate(flags) if not c]
        for idx, options in ((compressed, self._ipc_options), (plain, None)):
            together = self._write_together([blocks[i] for i in idx], options) if len(idx) > 1 else None
            for j, i in enumerate(idx):
                if together is not None:
                    out[i] = together[j]
                else:
                    data, raw, crc = self.write_block(blocks[i])
                    out[i] = ([data], len(data), raw, crc)
        return out

    def _compresses(self, batches: list[EncodedBatch]) -> bool:
        # compression has a fixed cost per buffer; small blocks are stored uncompressed
        return self._ipc_options is not None and sum(b.batch.num_rows for b in batches) >= COMPRESS_MIN_ROWS

    def _write_together(self, blocks: list[list[EncodedBatch]], options: Any) -> list[tuple[list[Any], int, int, int]] | None:
        """The blocks written as one IPC stream and cut into standalone streams, or ``None``
        (no C extension, or the stream's messages are not one per batch)."""
        if _crc32_ranges is None:
            return None
        batches = [b.batch for bl in blocks for b in bl]
        schema = batches[0].schema
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema, options=options) as w:
            w.write_table(pa.Table.from_batches(batches, schema))
        buf = sink.getvalue()
        ends = ipc_message_ends(buf)
        if ends is None or len(ends) != 1 + len(batches):
            return None
        bounds = [ends[0]]
        k = 0
        for bl in blocks:
            k += len(bl)
            bounds.append(ends[k])
        view = memoryview(buf)
        head = bytes(view[: ends[0]])
        crcs = _crc32_ranges(buf, np.array(bounds, np.int64), zlib.crc32(head), IPC_EOS)
        out = []
        for j, bl in enumerate(blocks):
            a, b = bounds[j], bounds[j + 1]
            length = len(head) + (b - a) + len(IPC_EOS)
            raw = sum(batch_nbytes(e.batch) for e in bl) if options is not None else length
            out.append(([head, view[a:b], IPC_EOS], length, raw, crcs[j]))
        return out


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
    target = rows / -(-rows // block_rows)
    if _kg_blocks is not None:  # the same plan in one C call without the GIL (numpy's below)
        plan = _kg_blocks(kg, target)
        if plan is None:
            return [batches]
        order_bytes, spans = plan
        sorted_batch = table.take(numpy_integers(np.frombuffer(order_bytes, np.int64))).combine_chunks().to_batches()[0]
        seq = sorted_batch.column(0).to_numpy()
        return [[EncodedBatch(sorted_batch.slice(b, n), int(seq[b]), int(seq[b + n - 1]), lo, hi)]
                for b, n, lo, hi in spans]  # fmt: skip
    return _split_numpy(batches, table, kg, target)


def _split_numpy(
    batches: list[EncodedBatch], table: pa.Table, kg: np.ndarray, target: float
) -> list[list[EncodedBatch]]:
    """:func:`split_by_key_group`'s plan and split in numpy (``fastpath.kg_blocks`` is the
    same plan in C)."""
    counts = np.bincount(kg)
    # greedily, in key-group order: a block ends once it holds the rows per block, and a key
    # group with that many rows alone is a block of its own
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
    # one take and one combined batch, sliced per block (no Arrow or numpy call per block:
    # each releases the GIL, and taking it back can wait for a task thread's long C call)
    sorted_batch = table.take(numpy_integers(order)).combine_chunks().to_batches()[0]
    seq = sorted_batch.column(0).to_numpy()
    kgs = kg[order]
    sizes = np.bincount(block, minlength=len(starts) + 1)
    sizes = sizes[sizes > 0]
    ends = np.cumsum(sizes)
    begins = ends - sizes
    return [
        [EncodedBatch(sorted_batch.slice(b, n), f, la, lo, hi)]
        for b, n, f, la, lo, hi in zip(
            begins.tolist(), sizes.tolist(), seq[begins].tolist(), seq[ends - 1].tolist(),
            np.minimum.reduceat(kgs, begins).tolist(), np.maximum.reduceat(kgs, begins).tolist(),
            strict=True,
        )
    ]


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
