"""Segment encoding (statelog/changelog/segment.py) against the reader that decodes it."""

from __future__ import annotations

import pyarrow as pa

from statelog.changelog import format as fmt
from statelog.changelog.ops import Op
from statelog.changelog.reader import SegmentReader
from statelog.changelog.segment import SegmentRef, StreamChunk, encode_segment
from statelog.keys import KeyGroupRange
from statelog.store import open_store
from statelog.types import PICKLE


def _batch(enc: fmt.BlockEncoder, state: str, first: int, n: int, value_type=None) -> fmt.EncodedBatch:
    value_type = value_type or pa.int64()
    cols = [
        [f"k{i}".encode() for i in range(n)],  # key bytes
        [i % 4 for i in range(n)],  # key group
        [b"\x00"] * n,  # namespace
        [Op.PUT.value] * n,
        [first + i for i in range(n)] if value_type is not PICKLE else [{"v": i} for i in range(n)],
    ]
    return enc.encode_batch(state, value_type, None, False, (first, n), cols)


def test_encode_segment_is_decoded_by_the_reader(tmp_path) -> None:
    store = open_store(tmp_path.as_uri())
    enc = fmt.BlockEncoder()
    chunks = [
        StreamChunk("op.0.a/count", "count", 0, 700, [_batch(enc, "count", 0, 600), _batch(enc, "count", 600, 100)]),
        StreamChunk("op.0.a/empty", "empty", 5, 5, []),  # a span without a block
        StreamChunk("op.0.a/obj", "obj", 3, 6, [_batch(enc, "obj", 3, 3, PICKLE)]),
    ]
    data, footer = encode_segment("w1", 7, 1234, chunks, enc)
    name = "changelog/w1/0000000007.seg"
    store.put(name, data)

    reader = SegmentReader(store)
    read = reader.verify_segment(name, len(data))
    assert read == footer
    assert (read.writer, read.segment, read.created_ms) == ("w1", 7, 1234)
    assert [(s.stream, s.start, s.end) for s in read.streams] == [(c.stream, c.start, c.end) for c in chunks]
    assert read.streams[1].bytes == 0 and [b.stream for b in read.blocks] == ["op.0.a/count", "op.0.a/obj"]
    count = read.blocks[0]
    assert (count.rows, count.first_seq, count.last_seq, count.kg_min, count.kg_max) == (700, 0, 699, 0, 3)
    assert read.streams[0].bytes == count.length

    span = read.streams[0]
    ref = SegmentRef(name, len(data), span.start, span.end, span.bytes)
    rows = [r for b in reader.read_range("op.0.a/count", 0, 700, KeyGroupRange(0, 127), [ref]) for r in b.rows()]
    assert [(seq, kg, op, key, value) for seq, kg, op, key, _ns, _uk, value, _exp in rows] == [
        (i, i % 4, Op.PUT.value, f"k{i}".encode(), i) for i in range(600)
    ] + [(600 + i, i % 4, Op.PUT.value, f"k{i}".encode(), 600 + i) for i in range(100)]
    ref = SegmentRef(name, len(data), 3, 6, read.streams[2].bytes)
    objs = [r[6] for b in reader.read_range("op.0.a/obj", 3, 6, KeyGroupRange(0, 127), [ref]) for r in b.rows()]
    assert objs == [{"v": 0}, {"v": 1}, {"v": 2}]

