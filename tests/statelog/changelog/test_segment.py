"""Segment encoding (statelog/changelog/segment.py) against the reader that decodes it."""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from statelog.changelog import format as fmt
from statelog.changelog.encoder import BlockEncoder, EncodedBatch
from statelog.changelog.ops import Op
from statelog.changelog.reader import SegmentReader
from statelog.changelog.segment import StreamChunk, encode_segment
from statelog.changelog.segment_ref import SegmentRef
from statelog.errors import CorruptionError, FormatVersionError
from statelog.keys.groups import KeyGroupRange
from statelog.store import open_store
from statelog.types import PICKLE


def _batch(enc: BlockEncoder, state: str, first: int, n: int, value_type=None) -> EncodedBatch:
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
    enc = BlockEncoder()
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


def _records(n: int, kgs: list[int], seq0: int) -> tuple[list[int], list[list]]:
    """``n`` put records of keys ``k<i>`` in key groups ``kgs`` (cycled), seqs with gaps (as
    coalescing leaves them)."""
    seqs = [seq0 + 2 * i for i in range(n)]
    cols = [[f"k{i % 3000}".encode() for i in range(n)], [kgs[i % len(kgs)] for i in range(n)], [b"\x00"] * n,
            [Op.PUT.value] * n, seqs]
    return seqs, cols


def _put_stream_segments(
    store, enc: BlockEncoder, count: int, size: Callable[[], int], kg_count: int, rng: random.Random
) -> tuple[list[SegmentRef], int]:
    """``count`` segments of stream ``op.0.a/count``, stored, each of ``size()`` put records of
    ``kg_count`` random key groups (:func:`_records`); their references and the next seq."""
    refs, seq = [], 0
    for i in range(count):
        n = size()
        seqs, cols = _records(n, [rng.randrange(128) for _ in range(kg_count)], seq)
        end = seqs[-1] + 1
        batch = enc.encode_batch("count", pa.int64(), None, False, seqs, cols)
        data, footer = encode_segment("w1", i, 1234, [StreamChunk("op.0.a/count", "count", seq, end, [batch])], enc)
        name = f"changelog/w1/{i:010d}.seg"
        store.put(name, data)
        refs.append(SegmentRef(name, len(data), seq, end, footer.streams[0].bytes))
        seq = end
    return refs, seq


@pytest.mark.parametrize("shape", ["uniform", "skewed"])
def test_a_stream_with_many_records_gets_a_block_per_key_group_range(tmp_path, monkeypatch, shape) -> None:
    """Segment version 2: a stream with many records is split into blocks of disjoint,
    ascending key-group ranges (a key group is never split), each in sequence order; a reader
    of one key group decodes one block; every record reads back, each key's in order."""
    rng = random.Random(7)
    if shape == "uniform":
        kgs = [rng.randrange(128) for _ in range(997)]
    else:  # one key group holds most records: it is one block of its own, larger than the rest
        kgs = [40] * 900 + [rng.randrange(128) for _ in range(97)]
    enc = BlockEncoder()
    seqs_a, cols_a = _records(12_000, kgs, 0)
    seqs_b, cols_b = _records(9_000, kgs[::-1], 24_000)
    big = [enc.encode_batch("count", pa.int64(), None, False, seqs_a, cols_a),
           enc.encode_batch("count", pa.int64(), None, False, seqs_b, cols_b)]
    chunks = [StreamChunk("op.0.a/count", "count", 0, 42_000, big),
              StreamChunk("op.0.a/small", "small", 0, 10, [_batch(enc, "small", 0, 10)])]
    data, footer = encode_segment("w1", 1, 1234, chunks, enc)
    name = "changelog/w1/0000000001.seg"
    store = open_store(tmp_path.as_uri())
    store.put(name, data)
    assert struct.unpack_from(">H", data, 8)[0] == 2

    reader = SegmentReader(store)
    assert reader.verify_segment(name, len(data)) == footer
    blocks = [b for b in footer.blocks if b.stream == "op.0.a/count"]
    assert [b.stream for b in footer.blocks[len(blocks):]] == ["op.0.a/small"]
    if shape == "uniform":
        assert len(blocks) >= 21_000 // fmt.SPLIT_BLOCK_ROWS
    else:  # the key groups before the hot one, the hot one alone, the rest
        assert [(b.kg_min <= 39, b.kg_min == b.kg_max == 40, b.kg_min >= 41) for b in blocks] == [
            (True, False, False), (False, True, False), (False, False, True)]
    assert footer.streams[0].bytes == sum(b.length for b in blocks)
    assert all(a.kg_max < b.kg_min for a, b in zip(blocks, blocks[1:], strict=False))
    assert sum(b.rows for b in blocks) == 21_000
    want = list(zip(seqs_a + seqs_b, cols_a[1] + cols_b[1], cols_a[0] + cols_b[0], strict=True))
    for b in blocks:
        t = reader.block(name, b)
        seq, kg = t.column("seq").to_pylist(), t.column("key_group").to_pylist()
        assert seq == sorted(seq) and (seq[0], seq[-1]) == (b.first_seq, b.last_seq)
        assert (min(kg), max(kg)) == (b.kg_min, b.kg_max) and t.num_rows == b.rows
        if shape == "uniform":
            assert b.rows <= 2 * fmt.SPLIT_BLOCK_ROWS
    ref = SegmentRef(name, len(data), 0, 42_000, footer.streams[0].bytes)
    got = [(r[0], r[1], r[3]) for b in reader.read_range("op.0.a/count", 0, 42_000, KeyGroupRange(0, 127), [ref])
           for r in b.rows()]
    assert sorted(got) == sorted(want)

    # in ranges (a reader of one key group of a large segment): the same rows, the trailer
    # and footer from one read of the segment's end, or, with a longer footer, two
    for tail_bytes in (64 << 10, 100):
        ranged = SegmentReader(store, tail_read_bytes=tail_bytes)
        for kg in (40, 3):
            rows = [(r[0], r[1], r[3]) for b in ranged.read_range("op.0.a/count", 0, 42_000, KeyGroupRange(kg, kg),
                                                                  [ref], whole_limit=0) for r in b.rows()]  # fmt: skip
            assert rows == [w for w in want if w[1] == kg]
        if shape == "uniform":  # not the whole segment (the skewed one's hot block is most of it)
            assert ranged.bytes_read < len(data)
    short = tmp_path / "short"
    short.mkdir()
    (short / name.split("/")[-1]).write_bytes(data[: len(data) - 1])
    with pytest.raises(CorruptionError, match="changelog segment"):
        SegmentReader(open_store(short.as_uri())).footer(name.split("/")[-1], len(data), whole_limit=0)

    decoded: list[fmt.BlockInfo] = []
    block = reader.block
    monkeypatch.setattr(reader, "block", lambda n, info: decoded.append(info) or block(n, info))
    present = sorted(set(kgs))
    for kg in (present[0], 40, present[len(present) // 2], present[-1]):
        decoded.clear()
        rows = [(r[0], r[1], r[3]) for b in reader.read_range("op.0.a/count", 0, 42_000, KeyGroupRange(kg, kg), [ref])
                for r in b.rows()]
        assert rows == [w for w in want if w[1] == kg]  # in sequence order
        assert len(decoded) == 1 and decoded[0].kg_min <= kg <= decoded[0].kg_max


def test_a_segment_with_one_block_per_stream_stays_version_1_and_other_versions_are_refused(tmp_path) -> None:
    """Below SPLIT_MIN_ROWS rows, or with one key group only, a stream is one block and the
    segment is version 1 (builds that read version 1 only read it); version 3 is refused."""
    enc = BlockEncoder()
    seqs, cols = _records(fmt.SPLIT_MIN_ROWS - 1, list(range(128)), 0)
    one_kg_seqs, one_kg = _records(3 * fmt.SPLIT_MIN_ROWS, [5], 0)
    for s, c in ((seqs, cols), (one_kg_seqs, one_kg)):
        chunk = StreamChunk("op.0.a/c", "c", 0, s[-1] + 1, [enc.encode_batch("c", pa.int64(), None, False, s, c)])
        data, footer = encode_segment("w1", 2, 1234, [chunk], enc)
        assert struct.unpack_from(">H", data, 8)[0] == 1 and len(footer.blocks) == 1
    seqs, cols = _records(fmt.SPLIT_MIN_ROWS, [0, 1], 0)  # from SPLIT_MIN_ROWS rows and 2 key groups on: split
    chunk = StreamChunk("op.0.a/c", "c", 0, seqs[-1] + 1, [enc.encode_batch("c", pa.int64(), None, False, seqs, cols)])
    data, footer = encode_segment("w1", 2, 1234, [chunk], enc)
    assert struct.unpack_from(">H", data, 8)[0] == 2 and [(b.kg_min, b.kg_max) for b in footer.blocks] == [(0, 0), (1, 1)]

    store = open_store(tmp_path.as_uri())
    small, _ = encode_segment("w1", 3, 1234, [StreamChunk("op.0.a/c", "c", 0, 10, [_batch(enc, "c", 0, 10)])], enc)
    bad = small[:8] + struct.pack(">H", 3) + small[10:]
    store.put("changelog/w1/0000000003.seg", bad)
    with pytest.raises(FormatVersionError, match="format version 3, this build reads versions 1, 2"):
        SegmentReader(store).verify_segment("changelog/w1/0000000003.seg", len(bad))


def _golden_chunks(enc: BlockEncoder) -> list[StreamChunk]:
    """Every record layout and value encoding: narrow int64 (compressed: 700 rows), pickled
    values with explicit seqs, a list state and a map state with expiries, an empty span."""
    put, delete, append, replace, mput, mremove = (
        int(o) for o in (Op.PUT, Op.DELETE, Op.LIST_APPEND, Op.LIST_REPLACE, Op.MAP_PUT, Op.MAP_REMOVE)
    )
    n = 700
    value_cols = [[f"k{i}".encode() for i in range(n)], [i % 7 for i in range(n)], [b"\x00"] * n, [put] * n,
                  [i * 3 for i in range(n)]]
    obj_cols = [[b"a", b"b", b"c"], [1, 2, 3], [b"\x00", b"ns", b"\x00"], [put, delete, put], [{"v": 1}, None, (2, 3)]]
    list_cols = [[b"a", b"b"], [0, 5], [b"\x00", b"\x00"], [append, replace], [None, None], [["x", "y"], []],
                 [None, 1_700_000_000_000]]
    map_cols = [[b"a", b"a", b"b"], [4, 4, 9], [b"\x00"] * 3, [mput, mremove, mput], ["u1", "u1", "u2"],
                [1.5, None, 2.5], [None, None, 5]]
    return [
        StreamChunk("op.0.x/count", "count", 0, n, [enc.encode_batch("count", pa.int64(), None, False, (0, n), value_cols)]),
        StreamChunk("op.0.x/obj", "obj", 10, 16, [enc.encode_batch("obj", PICKLE, None, False, [10, 12, 15], obj_cols)]),
        StreamChunk("op.0.x/none", "none", 7, 7, []),
        StreamChunk("op.0.x/events", "events", 3, 5, [enc.encode_batch("events", pa.string(), None, True, (3, 2), list_cols)]),
        StreamChunk("op.0.x/attrs", "attrs", 0, 3,
                    [enc.encode_batch("attrs", pa.float64(), pa.string(), False, (0, 3), map_cols)]),
    ]


def test_segment_bytes_are_those_of_the_format_before_the_split() -> None:
    """Splitting writer.py and format.py changed no byte: the digest was computed with the
    writer's inline segment encoding before the split (statelog/changelog/format.py v1)."""
    enc = BlockEncoder()
    data, footer = encode_segment("1700000000000-abcdef012345", 42, 1_700_000_000_123, _golden_chunks(enc), enc)
    assert len(data) == 11804
    assert hashlib.sha256(data).hexdigest() == "9cfab72e515186a8990abe67170518e3d8ec118e21b5792062f43943447b8c70"
    assert [s.bytes > 0 for s in footer.streams] == [True, True, False, True, True]


def test_the_persisted_format_module_holds_no_in_memory_layout_or_encoder() -> None:
    """format.py: persisted constants, schema, footer and their codec; records.py: the
    in-memory layouts; encoder.py: records to batches and blocks."""
    from statelog.changelog import format as fmt
    from statelog.changelog import records

    for name in ("C_KEY", "NARROW_WIDTH", "narrow_columns", "buffer_value_kind", "BlockEncoder", "EncodedBatch"):
        assert not hasattr(fmt, name), name
    assert (records.C_KEY, records.C_KG, records.C_NS, records.C_OP, records.N_VALUE) == (0, 1, 2, 3, 4)
    assert (records.W_UKEY, records.W_VALUE, records.W_EXPIRES) == (4, 5, 6)
    assert (records.NARROW_WIDTH, records.WIDE_WIDTH) == (5, 7)
    assert fmt.block_schema(pa.int64(), None, False).names == [
        "seq", "key_group", "op", "key", "namespace", "user_key", "value", "expires_ms",
    ]


def test_a_range_over_several_segments_reads_the_same_with_threads_reading_ahead(tmp_path) -> None:
    """``read_range`` with an executor: the segments' requests are made by its threads at once
    (two of them meet at a barrier, which reads one at a time would never reach), the batches
    are those of the plain read, in the same order, whole or in ranges, for any key groups; a
    corrupt segment among them fails with its name as the plain read does."""
    import concurrent.futures as cf
    import threading

    from statelog.testing import FaultInjectingStore

    def meeting(inner):
        """``inner`` whose first two reads each wait for the other."""
        store, barrier, reads, lock = FaultInjectingStore(inner), threading.Barrier(2, timeout=20), [0], threading.Lock()

        def meet(_op: str, _key: str) -> None:
            with lock:
                reads[0] += 1
                first_two = reads[0] <= 2
            if first_two:
                barrier.wait()

        store.before("get", meet)
        store.before("get_range", meet)
        return store, barrier, reads

    store = open_store(tmp_path.as_uri())
    enc = BlockEncoder()
    rng = random.Random(3)
    # 6 segments of one stream, the larger ones split by key-group range
    refs, seq = _put_stream_segments(store, enc, 6, lambda: rng.choice([50, 9_000]), 200, rng)

    def read(reader: SegmentReader, kgr: KeyGroupRange, whole_limit: int, pool=None, start=0, end=seq):
        return [(b.state, [r[:5] for r in b.rows()])
                for b in reader.read_range("op.0.a/count", start, end, kgr, refs, whole_limit, pool, 3)]  # fmt: skip

    with cf.ThreadPoolExecutor(3) as pool:
        for kgr, whole_limit, start, end in [(KeyGroupRange(0, 127), 4 << 20, 0, seq), (KeyGroupRange(17, 17), 0, 0, seq),
                                             (KeyGroupRange(40, 90), 0, 101, seq - 7), (KeyGroupRange(3, 3), 4 << 20, 0, seq)]:  # fmt: skip
            met, barrier, reads = meeting(store)
            plain = read(SegmentReader(store), kgr, whole_limit, None, start, end)
            assert plain and read(SegmentReader(met), kgr, whole_limit, pool, start, end) == plain
            assert reads[0] > 2 and not barrier.broken
        path = tmp_path / refs[4].name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        for p in (None, pool):
            with pytest.raises(CorruptionError, match=refs[4].name):
                read(SegmentReader(store), KeyGroupRange(0, 127), 4 << 20, p)


def test_a_reader_that_keeps_blocks_reads_each_small_segment_once_for_any_key_groups(tmp_path) -> None:
    """``SegmentReader(keep_bytes=...)``: the blocks of a segment read whole are kept, decoded
    and ordered by key group, so that a read of other key groups makes no request; every read
    equals the plain reader's (each key group's records in sequence order, several key groups'
    in the order of the segment), with or without an executor; past ``keep_bytes`` nothing is
    kept, and the reads are still equal."""
    import concurrent.futures as cf

    from statelog.testing import FaultInjectingStore

    store = open_store(tmp_path.as_uri())
    enc = BlockEncoder()
    rng = random.Random(11)
    # 5 small segments of one stream, records of random key groups
    refs, seq = _put_stream_segments(store, enc, 5, lambda: 300, 120, rng)
    gets: list[str] = []
    counted = FaultInjectingStore(store)
    for op in ("get", "get_range"):
        counted.before(op, lambda _op, key: gets.append(key))

    def read(reader: SegmentReader, kgr: KeyGroupRange, pool=None, start=0, end=seq):
        return [(b.state, [r[:5] for r in b.rows()])
                for b in reader.read_range("op.0.a/count", start, end, kgr, refs, 4 << 20, pool, 3)]  # fmt: skip

    reads = [(KeyGroupRange(17, 17), 0, seq), (KeyGroupRange(0, 127), 0, seq), (KeyGroupRange(3, 3), 0, seq),
             (KeyGroupRange(40, 90), 301, seq - 7), (KeyGroupRange(127, 127), 0, seq)]  # fmt: skip
    with cf.ThreadPoolExecutor(3) as pool:
        for p in (None, pool):
            keeping = SegmentReader(counted, keep_bytes=64 << 20)
            gets.clear()
            for kgr, start, end in reads:
                plain = read(SegmentReader(store), kgr, None, start, end)
                assert plain and read(keeping, kgr, p, start, end) == plain
                for _state, rows in plain:  # (the plain reader's order: by sequence)
                    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
            assert sorted(gets) == [r.name for r in refs]  # each segment once, for 5 reads
            assert keeping.kept_bytes > 0
            keeping.drop_kept()
            assert keeping.kept_bytes == 0
            small = SegmentReader(counted, keep_bytes=1)  # no room: nothing kept
            gets.clear()
            for kgr, start, end in reads:
                assert read(small, kgr, p, start, end) == read(SegmentReader(store), kgr, None, start, end)
            assert small.kept_bytes == 0 and len(gets) > len(refs)


# -- blocks written together ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_blocks_written_in_one_call_are_the_bytes_of_one_block_at_a_time(codec: str, monkeypatch) -> None:
    """``write_blocks`` (one Arrow IPC write and one checksum call for a stream's blocks) gives
    each block the bytes, length, uncompressed size and CRC-32 that ``write_block`` gives it
    alone: split blocks, blocks of several batches, blocks below the compression threshold
    (written apart, uncompressed) and a block holding an empty batch."""
    from statelog.changelog import encoder as encoder_module
    from statelog.changelog.encoder import split_by_key_group

    rng = random.Random(3)
    enc = BlockEncoder(codec=codec)
    kgs = [rng.randrange(64) for _ in range(301)]
    seqs, cols = _records(20_000, kgs, 0)
    split = split_by_key_group([enc.encode_batch("count", pa.int64(), None, False, seqs, cols)], 8192, 1500)
    assert len(split) > 5
    small = [_batch(enc, "count", 50_000, 100), _batch(enc, "count", 50_100, 7)]  # 107 rows: not compressed
    several = [_batch(enc, "count", 60_000, 600), _batch(enc, "count", 60_600, 900)]
    empty = [_batch(enc, "count", 70_000, 0), _batch(enc, "count", 70_000, 800)]
    for blocks in (split, split + [small, several], [several, small, several], [empty, several], [several]):
        got = enc.write_blocks(blocks)
        want = [enc.write_block(b) for b in blocks]
        assert [(b"".join(pieces), length, raw, crc) for pieces, length, raw, crc in got] == [
            (data, len(data), raw, crc) for data, raw, crc in want
        ]
    if codec != "none" and encoder_module._crc32_ranges is not None:  # the split blocks in one write
        calls: list[int] = []
        one = enc.write_block
        monkeypatch.setattr(enc, "write_block", lambda b: calls.append(len(b)) or one(b))
        enc.write_blocks(split + [small])
        assert calls == [2]  # only the uncompressed block alone


def test_the_message_ends_of_an_ipc_stream_are_found_and_anything_else_is_refused() -> None:
    batches = [pa.record_batch([pa.array(range(i * 10, i * 10 + 5 + i))], names=["x"]) for i in range(3)]
    for options in (None, pa.ipc.IpcWriteOptions(compression="zstd")):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema, options=options) as w:
            w.write_table(pa.Table.from_batches(batches))
        data = sink.getvalue().to_pybytes()
        ends = fmt.ipc_message_ends(data)
        assert ends is not None and len(ends) == 4 and ends[-1] == len(data) - len(fmt.IPC_EOS)
        for i, b in enumerate(batches):  # the schema, one batch's message and the end marker: a stream
            alone = data[: ends[0]] + data[ends[i] : ends[i + 1]] + fmt.IPC_EOS
            assert pa.ipc.open_stream(alone).read_all().to_batches() == [b]
        assert fmt.ipc_message_ends(data[:-1]) is None  # truncated
        assert fmt.ipc_message_ends(data + b"x") is None  # bytes after the end marker
        assert fmt.ipc_message_ends(b"\x00" * 16) is None  # no continuation marker
        assert fmt.ipc_message_ends(data[: ends[1] + 3]) is None  # cut inside a message


def test_crc32_ranges_is_zlibs_crc_of_each_range_and_refuses_bad_bounds() -> None:
    import zlib

    from statelog import _ext

    fastpath = _ext.load("fastpath")
    if not hasattr(fastpath, "crc32_ranges"):
        pytest.skip("the C extension is not built")
    data = random.Random(5).randbytes(100_003)
    bounds = np.array([0, 0, 1, 9, 4096, 4097, 77_777, 100_003], np.int64)
    init = zlib.crc32(b"schema")
    got = fastpath.crc32_ranges(data, bounds, init, fmt.IPC_EOS)
    assert got == [zlib.crc32(fmt.IPC_EOS, zlib.crc32(data[a:b], init)) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert fastpath.crc32_ranges(memoryview(data)[5:], np.array([3], np.int64), 0, b"") == []
    with pytest.raises(ValueError, match="ascend within the data"):
        fastpath.crc32_ranges(data, np.array([0, 100_004], np.int64), 0, b"")
    with pytest.raises(ValueError, match="ascend within the data"):
        fastpath.crc32_ranges(data, np.array([10, 5], np.int64), 0, b"")
    with pytest.raises(TypeError, match="int64"):
        fastpath.crc32_ranges(data, np.array([0, 5], np.int32), 0, b"")
    with pytest.raises(ValueError, match="CRC-32"):
        fastpath.crc32_ranges(data, bounds, 1 << 32, b"")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_key_group_split_in_c_is_the_numpy_split(seed: int) -> None:
    """``fastpath.kg_blocks`` plans the blocks as ``_split_numpy`` does: the same blocks, rows,
    key-group ranges and sequence numbers, for uniform, skewed and sparse key groups."""
    from statelog.changelog import encoder as encoder_module

    if encoder_module._kg_blocks is None:
        pytest.skip("the C extension is not built")
    rng = random.Random(seed)
    enc = BlockEncoder()
    shapes = [
        [rng.randrange(128) for _ in range(500)],
        [40] * 400 + [rng.randrange(128) for _ in range(100)],
        [rng.choice([0, 7, 32767, 65535]) for _ in range(300)],
    ]
    for kgs in shapes:
        seqs_a, cols_a = _records(9_000, kgs, 0)
        seqs_b, cols_b = _records(6_000, kgs[::-1], 20_000)
        batches = [enc.encode_batch("count", pa.int64(), None, False, seqs_a, cols_a),
                   enc.encode_batch("count", pa.int64(), None, False, seqs_b, cols_b)]
        table = pa.Table.from_batches([b.batch for b in batches])
        kg = table.column(1).to_numpy()
        for block_rows in (500, 4096, 20_000):
            target = 15_000 / -(-15_000 // block_rows)
            got = encoder_module.split_by_key_group(batches, 8192, block_rows)
            want = encoder_module._split_numpy(batches, table, kg, target)
            assert [[(e.batch, e.first_seq, e.last_seq, e.kg_min, e.kg_max) for e in bl] for bl in got] == [
                [(e.batch, e.first_seq, e.last_seq, e.kg_min, e.kg_max) for e in bl] for bl in want
            ]
    fastpath = encoder_module._ext.load("fastpath")
    assert fastpath.kg_blocks(np.array([5, 5, 5], np.uint16), 2.0) is None  # one key group: one block
    assert fastpath.kg_blocks(np.array([], np.uint16), 2.0) is None
    with pytest.raises(TypeError, match="uint16"):
        fastpath.kg_blocks(np.array([1, 2], np.int32), 2.0)
    with pytest.raises(ValueError, match="positive"):
        fastpath.kg_blocks(np.array([1, 2], np.uint16), 0.0)
