"""Changelog segment format, versions 1 and 2 (specified in ``docs/format.md``).

A segment object holds the changes of every stream one writer flushed at once (a stream
is one state of one subtask attempt)::

    header   8s magic b"STLGSEG1" | u16 version | u16 flags(0)            12 bytes
    blocks   Arrow IPC stream (record batches; zstd body compression from 512 rows), one per
             stream, or (version 2) several per stream, each of a key-group range
    footer   zstd(JSON index of the blocks and streams)
    trailer  u64 footer offset | u32 footer length | u32 CRC-32 of footer | 8s b"STLGEND1"

Every block and the footer carry a CRC-32 of their stored bytes; readers verify all of
them and raise :class:`~statelog.errors.CorruptionError` naming the object. The constants,
the block schema, the footer index and the codec of header, footer and trailer live here,
encoder and decoder side by side so that they stay symmetric; converting change records to
blocks is :mod:`statelog.changelog.encoder`, a segment's bytes
:func:`statelog.changelog.segment.encode_segment`, the in-memory record layouts
:mod:`statelog.changelog.records`.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa
import zstandard

from statelog.errors import CorruptionError, FormatVersionError
from statelog.types import PICKLE, ValueType, arrow_type

SEGMENT_MAGIC = b"STLGSEG1"
TRAILER_MAGIC = b"STLGEND1"
# Version 2 differs from 1 only in that a stream's records may be split into several blocks,
# each holding the records of a range of key groups (so that a reader of one key group decodes
# only its block); a segment whose streams have one block each is written as version 1.
SEGMENT_VERSION = 2
READ_VERSIONS = (1, 2)
SPLIT_MIN_ROWS = 8192  # a stream's records in a segment from this many rows on are split ...
SPLIT_BLOCK_ROWS = 4096  # ... into blocks of about this many rows, at key-group boundaries
_HEADER = struct.Struct(">8sHH")
_TRAILER = struct.Struct(">QII8s")
HEADER_SIZE = _HEADER.size
TRAILER_SIZE = _TRAILER.size

# Operations of change records (the ``op`` column): ``statelog.changelog.ops.Op``.

# Pseudo-states holding timers; their value is the timer's timestamp (int64 ms).
TIMER_STATES = ("__timers_event", "__timers_processing")

META_STATE = b"statelog.state"


class Codec(StrEnum):
    """Arrow IPC body compression of blocks (``LZ4`` is LZ4 frame); readers accept every one.
    The value is what the writer option ``compression`` is spelled as."""

    ZSTD = "zstd"
    LZ4 = "lz4"
    NONE = "none"


BLOCK_CODECS = tuple(c.value for c in Codec)
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


IPC_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's end-of-stream marker
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")


def ipc_message_ends(data: Any) -> list[int] | None:
    """The end offsets of the messages of an Arrow IPC stream written by pyarrow (schema,
    then record batches), or ``None`` unless ``data`` is exactly such messages and the
    end-of-stream marker. A message is the continuation marker, its metadata's length, the
    metadata (a flatbuffer ``Message``, whose field 3 is the body's length) and the body
    (Arrow's IPC format, "Encapsulated message format")."""
    view = memoryview(data)
    n = len(view)
    pos = 0
    ends: list[int] = []
    try:
        while True:
            if _U32.unpack_from(view, pos)[0] != 0xFFFFFFFF:
                return None
            size = _I32.unpack_from(view, pos + 4)[0]
            if size == 0:
                return ends if pos + len(IPC_EOS) == n else None
            meta = pos + 8
            table = meta + _U32.unpack_from(view, meta)[0]
            vtable = table - _I32.unpack_from(view, table)[0]
            field = _U16.unpack_from(view, vtable + 10)[0] if _U16.unpack_from(view, vtable)[0] > 10 else 0
            body = _I64.unpack_from(view, table + field)[0] if field else 0
            if size < 0 or body < 0:
                return None
            pos = meta + size + body
            ends.append(pos)
    except struct.error:
        return None


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


def encode_header(version: int = SEGMENT_VERSION) -> bytes:
    return _HEADER.pack(SEGMENT_MAGIC, version, 0)


def encode_footer_and_trailer(footer: SegmentFooter, footer_offset: int, version: int = SEGMENT_VERSION) -> bytes:
    body = {
        "format": "statelog.changelog-segment",
        "version": version,
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
    if version not in READ_VERSIONS:
        raise FormatVersionError(
            f"changelog segment {object_key}: format version {version}, this build reads "
            f"versions {', '.join(map(str, READ_VERSIONS))}; upgrade statelog",
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
        if body.get("version") not in READ_VERSIONS:
            raise FormatVersionError(
                f"changelog segment {object_key}: footer version {body.get('version')}, this build "
                f"reads versions {', '.join(map(str, READ_VERSIONS))}; upgrade statelog",
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
