"""The RocksDB database under a disk-backed working set: its options and its key layout.

One database per backend, in its own directory (:mod:`.directories`), opened through
``rocksdict`` in raw mode. Layout (docs/format.md section 10)::

    a key's record:    key group (2 bytes, big-endian) | length of the key bytes (4 bytes,
                       big-endian) | key bytes
                       -> {state id: entry} (its default-namespace entries)
    namespaced entry:  the same | state id (2 bytes, big-endian) | namespace bytes
                       -> the entry

so the entries of one key group are one contiguous range (dropped, iterated and bulk loaded
in key-group order), and one read brings a key's entries of every state (values:
:mod:`.codec`).
"""

from __future__ import annotations

from typing import Any

import rocksdict

from statelog.keys.encoding import encode_key

NONE_NSB = encode_key(None)  # the default namespace

# of the memory budget (budget.py has the caches' share)
MEMTABLE_SHARE = 0.15  # RocksDB's write buffers (two, of at most MAX_WRITE_BUFFER: the rest is the cache's)
MAX_WRITE_BUFFER = 16 << 20
BLOCK_CACHE_BYTES = 1 << 20  # RocksDB's block cache: blocks of iterators (point reads bypass it)


def write_buffer(memory_bytes: int) -> int:
    """Bytes of each of the two write buffers: at most 16 MB, as a point read searches the
    memtables first and a smaller one is a shorter search."""
    return min(MAX_WRITE_BUFFER, max(1 << 20, int(memory_bytes * MEMTABLE_SHARE / 2)))


def open_database(path: str, memory_bytes: int) -> Any:
    """The database in directory ``path`` (created), tuned for a working set's point reads."""
    db = rocksdict.Rdict(path, _options(memory_bytes))
    wopts = rocksdict.WriteOptions()
    wopts.disable_wal = True  # a cache rebuilt from the checkpoint: no log needed
    db.set_write_options(wopts)
    # a point read does not put its data block in RocksDB's block cache: the resident keys
    # are the cache of hot keys, and a block cache of the blocks that missed them only
    # costs (an insert and an eviction per read). Measured at 2x10^6 keys and 51 MB, 4
    # interleaved runs: uniform 53.6k updates/s with the block cache, 62.6k without
    # filling it, 59.7k with its budget given to the resident keys as here (Zipf 152k,
    # 157k, 161k); docs/performance.md
    ropts = rocksdict.ReadOptions()
    ropts.fill_cache(False)
    db.set_read_options(ropts)
    return db


def _options(memory_bytes: int) -> Any:
    r = rocksdict
    opts = r.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(write_buffer(memory_bytes))
    opts.set_max_write_buffer_number(2)
    # a Bloom filter per memtable: a read of a key not in it skips the skiplist search
    # (measured: a miss's read 9.0-10.1 us -> 6.5-7.0 us, 10^6 keys at 32 MB)
    opts.set_memtable_prefix_bloom_ratio(0.1)
    opts.set_memtable_whole_key_filtering(True)
    opts.set_max_background_jobs(2)
    opts.set_compression_type(r.DBCompressionType.lz4())
    table = r.BlockBasedOptions()
    # 1 KiB data blocks (RocksDB's default: 4 KiB): a point read, nearly all this store
    # does on a miss, checksums and decompresses a quarter of the bytes (measured: a
    # uniform phase over 2x10^6 keys at 51 MB, medians of 3 interleaved runs, 50.3k vs
    # 43.9k updates/s; 2 KiB: 45.8k)
    table.set_block_size(1024)
    # point reads bypass the block cache (see open_database); iterators' blocks only
    table.set_block_cache(r.Cache(BLOCK_CACHE_BYTES))
    table.set_bloom_filter(10, False)  # a miss (a new key) reads no data block
    # a point read finds its key in a data block by a hash index instead of a binary search
    # over restart points, and checks the block with XXH3 instead of CRC32c (measured at
    # 2x10^6 keys and 51 MB, 3 interleaved runs: uniform 45.9k vs 42.9k updates/s, Zipf
    # 119k vs 111k; a point read alone 5.6 vs 6.3 us)
    table.set_data_block_index_type(r.DataBlockIndexType.binary_and_hash())
    table.set_block_restart_interval(4)
    table.set_checksum_type(r.ChecksumType.xxh3())
    # index and filter blocks stay outside the block cache: in it, a small cache evicts them
    # and every read fetches them again (measured: 10x slower point reads)
    opts.set_block_based_table_factory(table)
    opts.set_max_open_files(256)
    # universal compaction rewrites less than leveled compaction (the cache writes back
    # at random keys all the time): measured 46k vs 40k updates/s on a Zipf workload
    opts.set_compaction_style(r.DBCompactionStyle.universal())
    opts.set_keep_log_file_num(2)
    return opts


def write_batch() -> Any:
    """An empty batch of puts and deletes (written at once by the working set)."""
    return rocksdict.WriteBatch(raw_mode=True)


def read_options() -> Any:
    return rocksdict.ReadOptions()


def disk_key(sid: int, kg: int, kb: bytes, nsb: bytes) -> bytes:
    """The database key of a namespaced entry."""
    return ((kg << 32) | len(kb)).to_bytes(6, "big") + kb + sid.to_bytes(2, "big") + nsb


def split_key(k: bytes) -> tuple[int, bytes, int, bytes]:
    """``(key group, key bytes, state id, namespace bytes)`` of a database key; state id 0
    for a key's record (no state id and namespace after the key bytes)."""
    n = int.from_bytes(k[2:6], "big")
    if len(k) == 6 + n:
        return int.from_bytes(k[:2], "big"), k[6:], 0, b""
    return int.from_bytes(k[:2], "big"), k[6 : 6 + n], int.from_bytes(k[6 + n : 8 + n], "big"), k[8 + n :]


__all__ = ["NONE_NSB", "disk_key", "open_database", "split_key", "write_batch", "write_buffer"]
