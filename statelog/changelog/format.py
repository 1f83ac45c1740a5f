"""Changelog segment format, version 1 (specified in ``docs/format.md``).

A segment object holds the changes of every stream one writer flushed at once (a stream
is one state of one subtask attempt)::

    header   8s magic b"STLGSEG1" | u16 version | u16 flags(0)            12 bytes
    blocks   Arrow IPC stream (record batches; zstd body compression from 512 rows), one per stream
    footer   zstd(JSON index of the blocks and streams)
    trailer  u64 footer offset | u32 footer length | u32 CRC-32 of footer | 8s b"STLGEND1"

Every block and the footer carry a CRC-32 of their stored bytes; readers verify all of
them and raise :class:`~statelog.errors.CorruptionError` naming the object. Encoding and
decoding live side by side here so that they stay symmetric.
"""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from statelog.errors import CorruptionError, FormatVersionError
from statelog.types import PICKLE, ValueType, arrow_type, to_arrow

SEGMENT_MAGIC = b"STLGSEG1"
TRAILER_MAGIC = b"STLGEND1"
SEGMENT_VERSION = 1
_HEADER = struct.Struct(">8sHH")
_TRAILER = struct.Struct(">QII8s")
HEADER_SIZE = _HEADER.size
TRAILER_SIZE = _TRAILER.size

# Operations of change records (the ``op`` column): ``statelog.changelog.ops.Op``.

# Pseudo-states holding timers; their value is the timer's timestamp (int64 ms).
TIMER_STATES = ("__timers_event", "__timers_processing")

# Record layouts in writer buffers (in memory only). A stream holds the records of one
# state of one subtask attempt, as a flat list of fixed-width records:
#   compact (value, reducing and aggregating state without TTL; timers):
#       key bytes, key group, namespace bytes, op, value
#   full (list and map state, any state with TTL):
#       key bytes, key group, namespace bytes, op, user key, value, expiry (ms) or None
C_KEY, C_KG, C_NS, C_OP = range(4)
C_VALUE = 4  # compact layout
F_UKEY, F_VALUE, F_EXPIRES = 4, 5, 6  # full layout
COMPACT_WIDTH = 5
FULL_WIDTH = 7
# A compact stream buffers its records as columns when the C extension is built
# (``RecordBuffer`` in ``statelog/_ext/fastpath.c``): key and namespace bytes as Arrow binary,
# key group uint16, op uint8, and the value by kind (these numbers are the C ``VK_*``):
VALUE_OBJECT = 0  # a list of Python values, converted like the flat-list layout
VALUE_INT64 = 1  # int64 + validity bitmap (every integer type; cast to the declared type)
VALUE_FLOAT64 = 2  # float64 + validity bitmap

META_STATE = b"statelog.state"
# Arrow IPC body compression of blocks ("lz4" is LZ4 frame); readers accept every one.
BLOCK_CODECS = ("zstd", "lz4", "none")
COMPRESS_MIN_ROWS = 512  # blocks with fewer rows are written without body compression
META_VALUE_ENC = b"statelog.value_encoding"
META_UKEY_ENC = b"statelog.user_key_encoding"


@dataclass(frozen=True)
class BlockInfo:
    """Index entry of one block in a segment footer."""

    stream: str
    state: str
    offset: int
    length: int
    crc32: int
    raw_length: int
    rows: int
    first_seq: int
    last_seq: int
    kg_min: int
    kg_max: int

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass(frozen=True)
class StreamSpan:
    """The seq range ``[start, end)`` of one stream flushed into a segment, and its bytes."""

    stream: str
    start: int
    end: int
    bytes: int


@dataclass(frozen=True)
class SegmentFooter:
    writer: str
    segment: int
    created_ms: int
    blocks: tuple[BlockInfo, ...]
    streams: tuple[StreamSpan, ...]


def block_schema(value_type: ValueType, user_key_type: ValueType | None, is_list: bool) -> pa.Schema:
    vt = arrow_type(value_type)
    if is_list:
        vt = pa.list_(vt)
    meta = {META_VALUE_ENC: b"pickle" if value_type is PICKLE else b"arrow"}
    if user_key_type is not None:
        meta[META_UKEY_ENC] = b"pickle" if user_key_type is PICKLE else b"arrow"
    return pa.schema(
        [
            pa.field("seq", pa.int64(), nullable=False),
            pa.field("key_group", pa.uint16(), nullable=False),
            pa.field("op", pa.uint8(), nullable=False),
            pa.field("key", pa.binary(), nullable=False),
            pa.field("namespace", pa.binary(), nullable=False),
            pa.field("user_key", pa.null() if user_key_type is None else arrow_type(user_key_type)),
            pa.field("value", vt),
            pa.field("expires_ms", pa.int64()),
        ],
        metadata=meta,
    )


class BlockEncoder:
    """Encodes batches of change records into compressed, checksummed blocks."""

    def __init__(self, level: int = 1, codec: str = "zstd") -> None:
        # Arrow's own IPC body compression runs in C++ without holding the GIL, so the
        # flusher's compression overlaps with the task thread on another core. One core:
        # with use_threads Arrow compresses the buffers of a batch on its whole CPU pool,
        # which on a small machine takes the task thread's core too.
        # ``codec`` is one of BLOCK_CODECS (ChangelogWriter checks the user's option)
        self._ipc_options = (
            None
            if codec == "none"
            else pa.ipc.IpcWriteOptions(
                compression=pa.Codec("zstd", compression_level=level) if codec == "zstd" else pa.Codec("lz4"),
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
        """Convert records given as columns (compact or full layout) to Arrow.

        ``seqs`` is a list of sequence numbers or ``(first, count)`` for contiguous ones. A
        column is a list of Python values or an Arrow array of its stored type (columns from
        :func:`compact_columns`). ``kg_range`` is ``(min, max)`` of the key groups when known.
        """
        n = len(cols[C_KEY])
        compact = len(cols) == COMPACT_WIDTH
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
        values = cols[C_VALUE if compact else F_VALUE]
        if isinstance(values, pa.Array):
            value_arr = values
        elif is_list:
            if value_type is PICKLE:
                dumps = pickle.dumps
                values = [None if v is None else [dumps(x, protocol=5) for x in v] for v in values]
            value_arr = pa.array(values, pa.list_(arrow_type(value_type)))
        else:
            value_arr = to_arrow(values, value_type)
        if user_key_type is None or compact:
            ukey_arr = _nulls(n, schema.field("user_key").type)
        else:
            ukey_arr = to_arrow(cols[F_UKEY], user_key_type)
        batch = pa.record_batch(
            [
                seq_arr,
                kgs,
                _column(cols[C_OP], pa.uint8()),
                _array(cols[C_KEY], pa.binary()),
                _column(cols[C_NS], pa.binary()),
                ukey_arr,
                value_arr,
                _nulls(n, pa.int64()) if compact else _column(cols[F_EXPIRES], pa.int64()),
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


_IOTA: list[pa.Array] = [pa.array(range(1 << 16), pa.int64())]
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
    if n > len(_IOTA[0]):
        _IOTA[0] = pa.array(range(max(n, 2 * len(_IOTA[0]))), pa.int64())
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


def buffer_value_kind(value_type: ValueType) -> int:
    """How a columnar record buffer stores the values of a state of ``value_type``."""
    if value_type is PICKLE:
        return VALUE_OBJECT
    if pa.types.is_integer(value_type):
        return VALUE_INT64
    if pa.types.is_float64(value_type):
        return VALUE_FLOAT64
    return VALUE_OBJECT


def compact_columns(chunk: tuple, value_type: ValueType) -> tuple[list[Any], int, int]:
    """The compact columns of records taken from a columnar buffer (``RecordBuffer.take()``).

    Returns ``([key, key group, namespace, op, value], kg_min, kg_max)``: Arrow arrays built on
    the taken bytes without per-record work; the value column is a list of Python values for
    ``VALUE_OBJECT``. Values the C buffer could not store typed (its overflow list, e.g. an int
    in a float64 state) make the value column go through :func:`to_arrow` like the flat-list
    layout.
    """
    n, koff, kdata, kgs, noff, ndata, ops, vals, validity, nulls, overflow, kg_min, kg_max = chunk
    buf = pa.py_buffer
    key = pa.Array.from_buffers(pa.binary(), n, [None, buf(koff), buf(kdata)], null_count=0)
    kg = pa.Array.from_buffers(pa.uint16(), n, [None, buf(kgs)], null_count=0)
    ns = pa.Array.from_buffers(pa.binary(), n, [None, buf(noff), buf(ndata)], null_count=0)
    op = pa.Array.from_buffers(pa.uint8(), n, [None, buf(ops)], null_count=0)
    value: Any = vals
    if not isinstance(vals, list):
        storage = pa.int64() if buffer_value_kind(value_type) == VALUE_INT64 else pa.float64()
        bitmap = None if validity is None else buf(validity)
        value = pa.Array.from_buffers(storage, n, [bitmap, buf(vals)], null_count=nulls)
        if overflow:
            py = value.to_pylist()
            for i, v in overflow:
                py[i] = v
            value = to_arrow(py, value_type)
        elif storage != value_type:
            value = value.cast(value_type)  # validated values: always in range
    return [key, kg, ns, op, value], kg_min, kg_max


def decode_block(data: bytes, info: BlockInfo, object_key: str) -> pa.Table:
    """Verify and decode one block read back from ``object_key``."""
    if len(data) != info.length:
        raise CorruptionError(
            f"changelog segment {object_key}: block at offset {info.offset} is {len(data)} bytes, "
            f"expected {info.length}",
            key=object_key,
        )
    if zlib.crc32(data) != info.crc32:
        raise CorruptionError(
            f"changelog segment {object_key}: checksum mismatch in block at offset {info.offset} "
            f"(stream {info.stream}, state {info.state}); the object is corrupt",
            key=object_key,
        )
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise CorruptionError(
            f"changelog segment {object_key}: cannot decode block at offset {info.offset}: {e}",
            key=object_key,
        ) from None
    if table.num_rows != info.rows:
        raise CorruptionError(
            f"changelog segment {object_key}: block at offset {info.offset} has {table.num_rows} rows, "
            f"index says {info.rows}",
            key=object_key,
        )
    return table


def encode_header() -> bytes:
    return _HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0)


def encode_footer_and_trailer(footer: SegmentFooter, footer_offset: int) -> bytes:
    body = {
        "format": "statelog.changelog-segment",
        "version": SEGMENT_VERSION,
        "writer": footer.writer,
        "segment": footer.segment,
        "created_ms": footer.created_ms,
        "blocks": [b.to_json() for b in footer.blocks],
        "streams": [[s.stream, s.start, s.end, s.bytes] for s in footer.streams],
    }
    raw = zstandard.ZstdCompressor(level=3).compress(
        json.dumps(body, separators=(",", ":")).encode("utf-8")
    )
    return raw + _TRAILER.pack(footer_offset, len(raw), zlib.crc32(raw), TRAILER_MAGIC)


def check_header(data: bytes, object_key: str) -> None:
    if len(data) < HEADER_SIZE:
        raise CorruptionError(f"changelog segment {object_key}: truncated header", key=object_key)
    magic, version, flags = _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptionError(f"changelog segment {object_key}: bad magic {magic!r}", key=object_key)
    if version != SEGMENT_VERSION:
        raise FormatVersionError(
            f"changelog segment {object_key}: format version {version}, this build reads "
            f"version {SEGMENT_VERSION}; upgrade statelog",
            key=object_key,
        )
    if flags != 0:
        raise CorruptionError(
            f"changelog segment {object_key}: unknown header flags 0x{flags:04x}", key=object_key
        )


def parse_trailer(data: bytes, object_key: str, object_size: int) -> tuple[int, int, int]:
    """Return ``(footer_offset, footer_length, footer_crc)`` from the last 24 bytes."""
    if len(data) != TRAILER_SIZE:
        raise CorruptionError(f"changelog segment {object_key}: truncated trailer", key=object_key)
    offset, length, crc, magic = _TRAILER.unpack(data)
    if magic != TRAILER_MAGIC:
        raise CorruptionError(
            f"changelog segment {object_key}: bad trailer magic {magic!r} (truncated or corrupt object)",
            key=object_key,
        )
    if offset < HEADER_SIZE or offset + length + TRAILER_SIZE != object_size:
        raise CorruptionError(
            f"changelog segment {object_key}: footer position {offset}+{length} does not fit the "
            f"object size {object_size}",
            key=object_key,
        )
    return offset, length, crc


def decode_footer(data: bytes, crc: int, object_key: str) -> SegmentFooter:
    if zlib.crc32(data) != crc:
        raise CorruptionError(
            f"changelog segment {object_key}: footer checksum mismatch; the object is corrupt",
            key=object_key,
        )
    try:
        body = json.loads(zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30))
        if not isinstance(body, dict):
            raise ValueError("the footer is not a JSON object")
        if body.get("format") != "statelog.changelog-segment":
            raise ValueError("not a changelog segment footer")
        if body.get("version") != SEGMENT_VERSION:
            raise FormatVersionError(
                f"changelog segment {object_key}: footer version {body.get('version')}, this build "
                f"reads version {SEGMENT_VERSION}; upgrade statelog",
                key=object_key,
            )
        return SegmentFooter(
            writer=body["writer"],
            segment=body["segment"],
            created_ms=body["created_ms"],
            blocks=tuple(BlockInfo(**b) for b in body["blocks"]),
            streams=tuple(StreamSpan(*s) for s in body["streams"]),
        )
    except FormatVersionError:
        raise
    except (zstandard.ZstdError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptionError(
            f"changelog segment {object_key}: cannot decode footer: {e}", key=object_key
        ) from None
