"""Segment encoding: the bytes of one changelog segment object.

:func:`encode_segment` is the writer's half of the segment format (``docs/format.md``
section 4); :class:`~statelog.changelog.reader.SegmentReader` is the reader's half and
decodes what it writes: header, blocks (one per stream, or several per stream by key-group
range when it has many records: segment version 2), footer, trailer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from statelog.changelog import format as fmt
from statelog.changelog.encoder import BlockEncoder, EncodedBatch, split_by_key_group


@dataclass(frozen=True)
class StreamChunk:
    """What one segment holds of one stream: records ``[start, end)`` and their batches.

    ``batches`` may be empty (the records were coalesced away, or none were taken): the
    span is still recorded in the footer.
    """

    stream: str
    state: str
    start: int
    end: int
    batches: Sequence[EncodedBatch]


def encode_segment(
    writer: str,
    segment: int,
    created_ms: int,
    chunks: Sequence[StreamChunk],
    encoder: BlockEncoder,
    split_min_rows: int = fmt.SPLIT_MIN_ROWS,
    split_block_rows: int = fmt.SPLIT_BLOCK_ROWS,
) -> tuple[bytes, fmt.SegmentFooter]:
    """The bytes of segment ``segment`` of ``writer``, holding ``chunks`` in order.

    Returns ``(data, footer)``; ``footer.streams[i]`` is the span of ``chunks[i]``. A stream
    with ``split_min_rows`` records or more gets a block per key-group range of about
    ``split_block_rows`` records (:func:`split_by_key_group`): then the
    segment is version 2, else version 1 (readable by builds that read version 1 only).
    """
    parts = [b""]  # the header, once the version is known
    offset = fmt.HEADER_SIZE
    blocks: list[fmt.BlockInfo] = []
    spans: list[fmt.StreamSpan] = []
    version = 1
    for c in chunks:
        size = 0
        if c.batches:
            split = split_by_key_group(list(c.batches), split_min_rows, split_block_rows)
            if len(split) > 1:
                version = 2
            for batches, (pieces, length, raw_len, crc) in zip(split, encoder.write_blocks(split), strict=True):
                parts.extend(pieces)
                blocks.append(
                    fmt.BlockInfo(
                        c.stream, c.state, offset, length, crc, raw_len,
                        sum(b.batch.num_rows for b in batches), min(b.first_seq for b in batches),
                        max(b.last_seq for b in batches), min(b.kg_min for b in batches),
                        max(b.kg_max for b in batches),
                    )
                )
                offset += length
                size += length
        spans.append(fmt.StreamSpan(c.stream, c.start, c.end, size))
    footer = fmt.SegmentFooter(writer, segment, created_ms, tuple(blocks), tuple(spans))
    parts[0] = fmt.encode_header(version)
    parts.append(fmt.encode_footer_and_trailer(footer, offset, version))
    return b"".join(parts), footer
