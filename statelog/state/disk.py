"""The disk-backed working set: keyed state larger than memory.

A keyed backend opened with ``state_store="disk"`` keeps its states' entries in an embedded
RocksDB database on local disk (through ``rocksdict``) under a bounded in-memory cache of hot
entries, instead of in Python dicts. Only the working set moves: the states' API and their
change records, the changelog, checkpoints, materializations and the Parquet format are the
same as with the in-memory store (Flink's changelog backend over RocksDB instead of the heap).

The directory is a local cache, never the source of truth: it is created empty when the
backend opens (a restore fills it from the checkpoint: the materialized rows in bulk, then the
changelog tail), deleted when the backend closes, never uploaded and never reused; the
directory of a process that died is deleted by the next backend that opens under the same
parent. RocksDB checks its blocks' checksums on every read: a corrupt local file fails the
task, which restarts from its last checkpoint into a fresh directory.

Layout (one database per backend; docs/format.md section 10)::

    a key's record:    key group (2 bytes, big-endian) | length of the key bytes (4 bytes,
                       big-endian) | key bytes
                       -> {state id: entry} (its default-namespace entries)
    namespaced entry:  the same | state id (2 bytes, big-endian) | namespace bytes
                       -> the entry

(values: a plain encoding of plain types, None, bool, int64, float, str, bytes and
lists, tuples and dicts of them, else a pickle: _rec_dumps_py below; entries: the in-memory
entries of the state kinds, statelog.restore.appliers), so the entries of one key group are
one contiguous range (dropped, iterated and bulk loaded in key-group order), and one read
brings a key's entries of every state. State ids are given by each backend in the order it
first sees each state.

Two caches sit over the database, both keyed by the key object as the in-memory tables are:

* **Resident keys** (the default namespace, where keyed state without windows lives): each
  state's default-namespace table is a plain ``dict``, as in memory, holding the entries of
  the *resident* keys only. ``set_current_key`` makes its key resident (the backend's key
  cache is :attr:`WorkingSet.resident`): a key not resident yet has its entries of every
  state read from the database into the dicts (:meth:`WorkingSet.admit`). So the states, and
  the C update path, work on dicts exactly as with the in-memory store. When the resident
  keys exceed the budget, the oldest tenth of them are written back in one batch (every
  entry they have: a plain dict does not tell which changed; an entry removed since it was
  read is deleted) and dropped from the dicts. Restore replays its changelog tail through
  :class:`ResidentView`, which makes each key it touches resident first.
* **Namespaced entries** (windows and other namespaces): a :class:`DiskTable` per state and
  namespace, a ``dict``-like cache over the database. Writes go to the cache and mark the
  entry dirty; when the cached entries exceed the budget, the oldest tenth of each table's
  cache is written back in one batch and dropped. A read that misses the cache reads the
  database and caches the entry. Entries of list and map states and of states with TTL are
  mutated in place by the states: a read of one marks it dirty too.

These two are the only caches of entries: RocksDB's point reads bypass its block cache (a
key read from the database was not among the hot keys, so its block is not worth keeping).
The work of a miss around RocksDB's (key group, database key, moving a record between the
database and the dicts) runs in C, statelog/_ext/workingset.c, when it is built; the
``_py`` functions here are its reference and fallback.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import shutil
import struct
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import rocksdict

from statelog import _ext
from statelog.errors import ConfigError, StatelogError
from statelog.keys import decode_key, encode_key, key_group_of_bytes, key_group_of_bytes_py

log = logging.getLogger(__name__)

__all__ = ["DiskTable", "ResidentView", "WorkingSet", "WorkingSetError", "default_state_dir"]

DIR_PREFIX = "statelog-ws-"
_TOMB: Any = object()  # a deleted entry not written back yet
_MISSING: Any = object()
_PROTOCOL = pickle.HIGHEST_PROTOCOL

# The memory budget's split: the rest (about an eighth) is left for the allocator's slack.
CACHE_SHARE = 0.72  # Python objects of resident keys and cached entries
MEMTABLE_SHARE = 0.15  # RocksDB's write buffers (two, of at most MAX_WRITE_BUFFER: the rest is the cache's)
MAX_WRITE_BUFFER = 16 << 20
BLOCK_CACHE_BYTES = 1 << 20  # RocksDB's block cache: blocks of iterators (point reads bypass it)
EVICT_FRACTION = 0.1  # of the cached entries written back and dropped at once
MIN_CACHE_ENTRIES = 1024
PROBE_KEYS = 4096  # resident keys at which their size is first measured
# bytes of an entry in the cache beyond its key and value: its slots in the cache and dirty
# dicts (they grow by doubling) and the dirty entry's key info
_SLOT_BYTES = 120
# bytes of a resident key beyond its key, key bytes and entries: its key info tuple and its
# slots in the resident, presence and touched sets and dicts and in each state's dict (grown by doubling)
_RESIDENT_BYTES = 190
_ENTRY_SLOT_BYTES = 70
NONE_NSB = encode_key(None)  # the default namespace


class WorkingSetError(StatelogError):
    """The local database of a disk-backed working set failed (corrupt, I/O error, disk full)."""


def default_state_dir() -> str:
    """Where working-set directories go unless ``state_dir`` says otherwise."""
    return os.path.join(tempfile.gettempdir(), "statelog-state")


def _deep_size(obj: Any) -> int:
    """Approximate bytes of an entry's objects (containers one level deep, and TTL pairs)."""
    n = sys.getsizeof(obj)
    if isinstance(obj, list):
        for e in obj:
            n += sys.getsizeof(e)
            if isinstance(e, list):
                n += sum(sys.getsizeof(x) for x in e)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            n += sys.getsizeof(k) + sys.getsizeof(v)
            if isinstance(v, list):
                n += sum(sys.getsizeof(x) for x in v)
    return n


def _write_buffer(memory_bytes: int) -> int:
    """Bytes of each of the two write buffers: at most 16 MB, as a point read searches the
    memtables first and a smaller one is a shorter search."""
    return min(MAX_WRITE_BUFFER, max(1 << 20, int(memory_bytes * MEMTABLE_SHARE / 2)))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: str) -> None:
    """Delete working-set directories of processes that are gone (they are never reused)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(DIR_PREFIX):
            continue
        try:
            pid = int(name[len(DIR_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            log.info("deleting the working-set directory of a process that is gone: %s", name)
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _key_prefix_py(kg: int, kb: bytes) -> bytes:
    """The database keys of every entry of one key start with this."""
    return ((kg << 32) | len(kb)).to_bytes(6, "big") + kb


def _install_py(key: Any, rec: dict[int, Any], index: dict[int, int], primary: list[dict[Any, Any]],
                extra: dict[Any, dict[int, Any]]) -> None:
    """Put a key's record (``{state id: entry}``) into the states' dicts; the entries of states
    not registered yet are kept in ``extra`` with the key."""
    for sid, entry in rec.items():
        i = index.get(sid)
        if i is not None:
            primary[i][key] = entry
        else:
            extra.setdefault(key, {})[sid] = entry


def _install_raw_py(
    key: Any, info: tuple[type, bytes, int], raw: bytes | None, loads: Any, present: set[Any], index: dict[int, int],
    primary: list[dict[Any, Any]], extra: dict[Any, dict[int, Any]], res: dict[Any, tuple[type, bytes, int]],
) -> None:
    """Make ``key`` resident with its record ``raw`` (``None``: it has none): then it is
    ``present`` and its entries are in the states' dicts."""
    if raw is not None:
        present.add(key)
        rec = loads(raw)
        if not isinstance(rec, dict):
            raise TypeError("a key's record is not a dict")
        _install_py(key, rec, index, primary, extra)
    res[key] = info


def _admit_py(
    key: Any, info: tuple[type, bytes, int], get: Any, loads: Any, present: set[Any], index: dict[int, int],
    primary: list[dict[Any, Any]], extra: dict[Any, dict[int, Any]], res: dict[Any, tuple[type, bytes, int]],
) -> bool:
    """Make ``key`` resident: its record, read by ``get``, into the states' dicts (when it has
    one: then it is ``present``). Returns whether it had one."""
    raw = get(_key_prefix_py(info[2], info[1]))
    _install_raw_py(key, info, raw, loads, present, index, primary, extra, res)
    return raw is not None


def _write_back_py(
    keys: list[Any], res: dict[Any, tuple[type, bytes, int]], drop: bool, primary: list[dict[Any, Any]],
    sids: list[int], extra: dict[Any, dict[int, Any]], present: set[Any], put: Any, delete: Any,
    dumps: Any, protocol: int,
) -> int:
    """Write each of ``keys``' entries of every state as one record (``put``); a key with no
    entry left whose record is in the database is deleted (``delete``). The puts and deletes
    are made in the order of their database keys, after every key is done (RocksDB's memtable
    inserts a sorted batch faster). With ``drop`` the keys stop being resident: their entries
    leave the dicts. Returns the puts and deletes."""
    ops: list[tuple[bytes, bytes | None]] = []
    for key in keys:
        info = res[key]
        pre = _key_prefix(info[2], info[1])
        rec: dict[int, Any] = {}
        for i, table in enumerate(primary):
            v = table.pop(key, _MISSING) if drop else table.get(key, _MISSING)
            if v is not _MISSING:
                rec[sids[i]] = v
        more = extra.pop(key, None) if drop else extra.get(key)
        if more:
            rec.update(more)
        if rec:
            data = dumps(rec, protocol)
            if not isinstance(data, bytes):
                raise TypeError("write_back: dumps did not return bytes")
            ops.append((pre, data))
            if not drop:
                present.add(key)
        elif key in present:
            ops.append((pre, None))
            present.discard(key)
        if drop:
            present.discard(key)
            del res[key]
    ops.sort(key=lambda op: op[0])
    for pre, data in ops:
        if data is None:
            delete(pre)
        else:
            put(pre, data)
    return len(ops)


def _plan_py(
    keys: Iterable[Any], resident: dict[Any, tuple[type, bytes, int]], lo: int, hi: int, maxp: int, encode: Any,
) -> tuple[list[Any], list[tuple[type, bytes, int]], list[bytes]]:
    """The keys of a prefetch to read, in their order: each of ``keys`` once, not resident,
    hashable and encodable (others are skipped), of a key group in ``lo..hi``. Returns the
    keys, their key infos and their records' database keys."""
    seen: set[Any] = set()
    out: tuple[list[Any], list[tuple[type, bytes, int]], list[bytes]] = ([], [], [])
    for key in keys:
        try:
            if key in resident or key in seen:
                continue
            kb = encode(key)
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - set_current_key reports it for its record
            continue
        kg = key_group_of_bytes_py(kb, maxp)
        if lo <= kg <= hi:
            seen.add(key)
            out[0].append(key)
            out[1].append((type(key), kb, kg))
            out[2].append(_key_prefix_py(kg, kb))
    return out


def _install_many_py(
    keys: list[Any], infos: list[tuple[type, bytes, int]], raws: list[bytes | None], loads: Any, present: set[Any],
    index: dict[int, int], primary: list[dict[Any, Any]], extra: dict[Any, dict[int, Any]],
    res: dict[Any, tuple[type, bytes, int]],
) -> None:
    """Make each of ``keys`` resident with its record already read (``raws``; ``None``: none)."""
    for key, info, raw in zip(keys, infos, raws, strict=True):
        _install_raw_py(key, info, raw, loads, present, index, primary, extra, res)


def _clock_victims_py(res: dict[Any, Any], n: int, touched: set[Any], cur: Any, missing: Any) -> list[Any]:
    """The resident keys an eviction writes back, oldest first (CLOCK): of the oldest ``3n``,
    a key set current again since admitted or spared (``touched``) is spared once and moves to
    the back; any other key but the current one is a victim, up to ``n``. If fewer were found
    (mostly touched keys), the oldest not chosen fill up to ``n``."""
    victims: list[Any] = []
    for key in list(itertools.islice(res, 3 * n)):
        if len(victims) >= n:
            break
        if key in touched:
            touched.discard(key)
            res[key] = res.pop(key)
        elif key is not cur and not (cur is not missing and key == cur):
            victims.append(key)
    if len(victims) < n:
        chosen = set(victims)
        for key in list(itertools.islice(res, 2 * n + 1)):
            if len(victims) >= n:
                break
            if key not in chosen and key is not cur and not (cur is not missing and key == cur):
                victims.append(key)
                touched.discard(key)
    return victims


# -- the database's values: plain form of plain types, pickle for the rest ----------------
# (docs/format.md section 10; statelog/_ext/reccodec.h is the C version)
REC_MAGIC = 0x01
_REC_PICKLE = 0x80  # a pickle of protocol 2 or later starts with PROTO
_REC_MAX_DEPTH = 32
_R_NONE, _R_FALSE, _R_TRUE, _R_INT, _R_FLOAT, _R_STR, _R_BYTES, _R_LIST, _R_TUPLE, _R_DICT = range(10)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_F64 = struct.Struct("<d")


class _NotPlain(Exception):
    """A value outside the plain form's types."""


def _uv(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _rec_enc(o: Any, out: list[bytes], depth: int) -> None:
    t = type(o)
    if o is None:
        out.append(bytes((_R_NONE,)))
    elif t is bool:
        out.append(bytes((_R_TRUE if o else _R_FALSE,)))
    elif t is int:
        if not _INT64[0] <= o <= _INT64[1]:
            raise _NotPlain
        out.append(bytes((_R_INT,)) + _uv(((o << 1) ^ (o >> 63)) & 0xFFFFFFFFFFFFFFFF))
    elif t is float:
        out.append(bytes((_R_FLOAT,)) + _F64.pack(o))
    elif t is str or t is bytes:
        if t is str:
            try:
                o = o.encode()
            except UnicodeEncodeError:  # lone surrogates: pickle keeps them
                raise _NotPlain from None
        out.append(bytes((_R_STR if t is str else _R_BYTES,)) + _uv(len(o)) + o)
    elif depth >= _REC_MAX_DEPTH:
        raise _NotPlain
    elif t is list or t is tuple:
        out.append(bytes((_R_LIST if t is list else _R_TUPLE,)) + _uv(len(o)))
        for e in o:
            _rec_enc(e, out, depth + 1)
    elif t is dict:
        out.append(bytes((_R_DICT,)) + _uv(len(o)))
        for k, v in o.items():
            _rec_enc(k, out, depth + 1)
            _rec_enc(v, out, depth + 1)
    else:
        raise _NotPlain


def _rec_dumps_py(value: Any, protocol: int) -> bytes:
    """A value of the database (a key's record or a namespaced entry) as bytes: the plain
    form when it is made of None, bool, int of int64, float, str, bytes, and lists, tuples and
    dicts of them (exact types, at most 32 deep), else a pickle (protocol 2 or later)."""
    out = [bytes((REC_MAGIC,))]
    try:
        _rec_enc(value, out, 0)
    except _NotPlain:
        if protocol < 2:
            raise ValueError("rec_dumps: the pickle protocol must be 2 or later") from None
        return pickle.dumps(value, protocol)
    return b"".join(out)


def _rec_corrupt(what: str) -> ValueError:
    return ValueError(f"a working-set value does not parse: {what}")


def _rec_get_uv(raw: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while shift < 64 and i < len(raw):
        c = raw[i]
        i += 1
        if shift == 63 and c > 1:
            break
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, i
        shift += 7
    raise _rec_corrupt("a bad length or int")


def _rec_dec(raw: bytes, i: int, depth: int) -> tuple[Any, int]:
    if i >= len(raw):
        raise _rec_corrupt("it ends inside a value")
    tag = raw[i]
    i += 1
    if tag <= _R_TRUE:
        return (None, False, True)[tag], i
    if tag == _R_INT:
        u, i = _rec_get_uv(raw, i)
        return (u >> 1) ^ -(u & 1), i
    if tag == _R_FLOAT:
        if len(raw) - i < 8:
            raise _rec_corrupt("it ends inside a float")
        return _F64.unpack_from(raw, i)[0], i + 8
    if tag in (_R_STR, _R_BYTES):
        n, i = _rec_get_uv(raw, i)
        if n > len(raw) - i:
            raise _rec_corrupt("a length beyond its end")
        b = raw[i : i + n]
        return (b.decode() if tag == _R_STR else b), i + n
    if tag in (_R_LIST, _R_TUPLE, _R_DICT):
        if depth >= _REC_MAX_DEPTH:
            raise _rec_corrupt("nested too deep")
        n, i = _rec_get_uv(raw, i)
        if n > (len(raw) - i) // (2 if tag == _R_DICT else 1):
            raise _rec_corrupt("a count beyond its end")
        if tag == _R_DICT:
            d: dict[Any, Any] = {}
            for _ in range(n):
                k, i = _rec_dec(raw, i, depth + 1)
                v, i = _rec_dec(raw, i, depth + 1)
                d[k] = v
            return d, i
        items = []
        for _ in range(n):
            e, i = _rec_dec(raw, i, depth + 1)
            items.append(e)
        return (items if tag == _R_LIST else tuple(items)), i
    raise _rec_corrupt("an unknown tag")


def _rec_loads_py(raw: bytes) -> Any:
    """The value of :func:`_rec_dumps_py`'s bytes; ValueError if they do not parse."""
    if not isinstance(raw, bytes):
        raise TypeError("rec_loads(raw: bytes)")
    if raw[:1] == bytes((REC_MAGIC,)):
        v, i = _rec_dec(raw, 1, 0)
        if i != len(raw):
            raise _rec_corrupt("bytes follow the value")
        return v
    if raw[:1] == bytes((_REC_PICKLE,)):
        return pickle.loads(raw)
    raise _rec_corrupt("an unknown first byte" if raw else "it is empty")


# their C versions (statelog/_ext/workingset.c) when built: a miss runs them once or twice
_C = _ext.load("workingset")
_key_prefix = _C.key_prefix if _C is not None else _key_prefix_py
_install = _C.install if _C is not None else _install_py
_admit = _C.admit if _C is not None else _admit_py
_write_back = _C.write_back if _C is not None else _write_back_py
_plan = _C.plan if _C is not None else _plan_py
_install_many = _C.install_many if _C is not None else _install_many_py
_clock_victims = _C.clock_victims if _C is not None else _clock_victims_py
_DUMPS = _C.rec_dumps if _C is not None else _rec_dumps_py
_LOADS = _C.rec_loads if _C is not None else _rec_loads_py


def _disk_key(sid: int, kg: int, kb: bytes, nsb: bytes) -> bytes:
    return ((kg << 32) | len(kb)).to_bytes(6, "big") + kb + sid.to_bytes(2, "big") + nsb


def _split_key(k: bytes) -> tuple[int, bytes, int, bytes]:
    """``(key group, key bytes, state id, namespace bytes)`` of a database key; state id 0
    for a key's record (no state id and namespace after the key bytes)."""
    n = int.from_bytes(k[2:6], "big")
    if len(k) == 6 + n:
        return int.from_bytes(k[:2], "big"), k[6:], 0, b""
    return int.from_bytes(k[:2], "big"), k[6 : 6 + n], int.from_bytes(k[6 + n : 8 + n], "big"), k[8 + n :]


class WorkingSet:
    """The on-disk store and cache budget of one keyed backend's states."""

    def __init__(
        self, memory_bytes: int, directory: str | None, max_parallelism: int, label: str = "",
        cache_entries: int | None = None,
    ) -> None:
        """``cache_entries`` fixes the number of cached entries (tests) instead of deriving
        it from ``memory_bytes`` and the measured size of entries."""
        self._rocksdict = rocksdict
        self.memory_bytes = memory_bytes
        self.max_parallelism = max_parallelism
        parent = directory or default_state_dir()
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"state_dir {parent!r} cannot be created ({e.strerror}); give a writable local directory"
            ) from None
        _remove_stale(parent)
        self.path = os.path.join(parent, f"{DIR_PREFIX}{os.getpid()}-{label}{uuid.uuid4().hex[:8]}")
        os.makedirs(self.path)
        self._db = rocksdict.Rdict(self.path, self._options(memory_bytes))
        self._wopts = rocksdict.WriteOptions()
        self._wopts.disable_wal = True  # a cache rebuilt from the checkpoint: no log needed
        self._db.set_write_options(self._wopts)
        # a point read does not put its data block in RocksDB's block cache: the resident keys
        # are the cache of hot keys, and a block cache of the blocks that missed them only
        # costs (an insert and an eviction per read). Measured at 2x10^6 keys and 51 MB, 4
        # interleaved runs: uniform 53.6k updates/s with the block cache, 62.6k without
        # filling it, 59.7k with its budget given to the resident keys as here (Zipf 152k,
        # 157k, 161k); docs/performance.md
        ropts = rocksdict.ReadOptions()
        ropts.fill_cache(False)
        self._db.set_read_options(ropts)
        self._closed = False
        self._tables: list[DiskTable] = []
        self._states: dict[str, int] = {}
        # namespaces bulk-loaded per state (its tables are created when the state registers)
        self.namespaces: dict[str, set[bytes]] = {}
        # the Python objects' share, and what the write buffers leave of theirs
        self.cache_bytes = max(0, int(memory_bytes * (CACHE_SHARE + MEMTABLE_SHARE)) - 2 * _write_buffer(memory_bytes))
        self.entry_bytes = 200.0  # refined from samples at every eviction
        self._fixed = cache_entries
        self.limit = cache_entries or max(MIN_CACHE_ENTRIES, int(self.cache_bytes / self.entry_bytes))
        self.cached = 0
        # resident keys: key -> key info (type, key bytes, key group), oldest first; the
        # backend's key cache (set_current_key makes a key resident through admit())
        self.resident: dict[Any, tuple[type, bytes, int]] = {}
        # resident keys whose record is in the database (deleted on eviction if they hold no
        # entry any more)
        self._present: set[Any] = set()
        # the default-namespace dict of each registered state, and its state id, in id order
        self._primary: list[dict[Any, Any]] = []
        self._primary_sids: list[int] = []
        self._sid_index: dict[int, int] = {}
        # resident key -> {state id: entry} of states restored but not registered yet
        self._extra: dict[Any, dict[int, Any]] = {}
        # the key context of the backend (set by it): its current key is never evicted
        self.key_context: Any = None
        # resident keys set current again since admitted or spared (the backend's key setter
        # adds them): spared once by the next eviction
        self.touched: set[Any] = set()
        # the keys the last prefetch made resident: their first records find them resident
        # and mark them touched, but that use is their admission, not a second one (the next
        # prefetch unmarks them, so that CLOCK spares only keys used again)
        self._fetched: list[Any] = []
        self.resident_bytes = 400.0  # refined from samples at every eviction
        self.resident_limit = cache_entries or max(MIN_CACHE_ENTRIES, int(self.cache_bytes / self.resident_bytes))
        # figures (stats, benchmarks)
        self.prefetched = 0
        self.reads = 0
        self.misses = 0
        self.written_back = 0
        self.evictions = 0

    def _options(self, memory_bytes: int) -> Any:
        r = self._rocksdict
        opts = r.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(_write_buffer(memory_bytes))
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
        # point reads bypass the block cache (see __init__); iterators' blocks only
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

    def __repr__(self) -> str:
        return f"WorkingSet({self.path!r}, memory={self.memory_bytes}, cached={self.cached})"

    # -- tables --------------------------------------------------------------------------------

    def state_id(self, name: str) -> int:
        sid = self._states.get(name)
        if sid is None:
            sid = self._states[name] = len(self._states) + 1
            if sid >= 1 << 16:
                raise StatelogError("a disk-backed backend holds at most 65535 states")
        return sid

    def table(self, state: str, nsb: bytes, mutable: bool, ctx: Any) -> Any:
        """The table of a state's entries in namespace ``nsb``: a plain dict of resident keys
        for the default namespace, a :class:`DiskTable` for the others."""
        sid = self.state_id(state)
        if nsb == NONE_NSB:
            # a state registers: its dict must hold every resident key's entry, so the
            # resident keys are written back and dropped (states register before records flow)
            self.release()
            d: dict[Any, Any] = {}
            self._sid_index[sid] = len(self._primary)
            self._primary.append(d)
            self._primary_sids.append(sid)
            if ctx.key_info[2] >= 0:  # registered while a key is current: it stays resident
                self.admit(ctx.key, ctx.key_info)
            return d
        t = DiskTable(self, sid, nsb, mutable, ctx)
        self._tables.append(t)
        return t

    def replay_view(self, table: dict[Any, Any]) -> ResidentView:
        """``table`` (a state's default-namespace dict) for writes to any key (restore)."""
        return ResidentView(self, table)

    def key_info(self, key: Any) -> tuple[type, bytes, int]:
        kb = encode_key(key)
        return (type(key), kb, key_group_of_bytes(kb, self.max_parallelism))

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        try:
            return self._db.get(key)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors (corruption, I/O) are plain exceptions
            raise self._failed(e) from None

    def loads(self, raw: bytes) -> Any:
        """The value of a database value's bytes (a value that does not parse fails the task)."""
        try:
            return _LOADS(raw)
        except Exception as e:  # noqa: BLE001 - ValueError, or a broken pickle's error
            raise self._failed(e) from None

    def _write(self, batch: Any) -> None:
        try:
            self._db.write(batch)
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None

    def _failed(self, e: BaseException) -> WorkingSetError:
        return WorkingSetError(
            f"the disk-backed working set in {self.path} failed: {e}. It is a local cache of the "
            "checkpointed state: restart the job from its latest checkpoint, which rebuilds it in a "
            "new directory (check the disk under state_dir: free space, I/O errors)"
        )

    # -- resident keys --------------------------------------------------------------------------

    def admit(self, key: Any, info: tuple[type, bytes, int]) -> None:
        """Make ``key`` resident: read its record (its default-namespace entries of every
        state, one database read) into the states' dicts; the oldest resident keys are written
        back and dropped first if over budget."""
        res = self.resident
        n = len(res)
        if n >= self.resident_limit:
            self.evict_resident()
        elif n == PROBE_KEYS and not self._fixed:  # measure early, before the budget is reached
            self._sample_resident(list(itertools.islice(res, 64)), probe=True)
        self._check_open()
        try:
            _admit(key, info, self._db.get, _LOADS, self._present, self._sid_index, self._primary, self._extra, res)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors (and an unreadable record) are plain exceptions
            raise self._failed(e) from None
        self.misses += 1

    # -- prefetch: the keys of the next records, read in one batch ---------------------------

    def prefetch(self, keys: Iterable[Any], lo: int, hi: int) -> int:
        """Make the keys among ``keys`` that are not resident yet resident with one batched
        database read (RocksDB's multi-get: cheaper per key than a read per record). Keys
        that are unhashable or cannot be encoded, and keys of key groups outside ``lo..hi``,
        are skipped. Returns the number of keys read."""
        if self._fetched:
            self.touched.difference_update(self._fetched)
            self._fetched = []
        todo, infos, prefixes = _plan(keys, self.resident, lo, hi, self.max_parallelism, encode_key)
        if not todo:
            return 0
        self._check_open()
        raws = self._multi_get(prefixes)
        res = self.resident
        n = len(res)
        while n and n + len(todo) > self.resident_limit:
            self.evict_resident()
            if len(res) == n:
                break
            n = len(res)
        probe = not self._fixed and n < PROBE_KEYS <= n + len(todo)
        try:
            _install_many(todo, infos, raws, _LOADS, self._present, self._sid_index, self._primary, self._extra, res)
        except Exception as e:  # noqa: BLE001 - an unreadable record
            raise self._failed(e) from None
        if probe:  # measured once early, as admit() does
            self._sample_resident(list(itertools.islice(res, 64)), probe=True)
        self._fetched = todo
        self.misses += len(todo)
        self.prefetched += len(todo)
        return len(todo)

    def _multi_get(self, prefixes: list[bytes]) -> list[bytes | None]:
        try:
            return self._db.get(prefixes)
        except Exception as e:  # noqa: BLE001 - RocksDB's errors are plain exceptions
            raise self._failed(e) from None

    def _write_back_resident(self, keys: list[Any], batch: Any, drop: bool) -> None:
        """Write ``keys``' records into ``batch`` (see :func:`_write_back_py`)."""
        _write_back(keys, self.resident, drop, self._primary, self._primary_sids, self._extra,
                    self._present, batch.put, batch.delete, _DUMPS, _PROTOCOL)

    def evict_resident(self) -> None:
        """Write back and drop :data:`EVICT_FRACTION` of the resident keys, the oldest first,
        giving a second chance to keys set current again since they were admitted or last
        spared (they move to the back: CLOCK, an approximation of least recently used)."""
        self._check_open()
        res = self.resident
        n = max(1, int(len(res) * EVICT_FRACTION))
        cur = self.key_context.key if self.key_context is not None else _MISSING
        victims = _clock_victims(res, n, self.touched, cur, _MISSING)
        if not self._fixed:
            self._sample_resident(victims[:16])
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        self._write_back_resident(victims, batch, True)
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)
        self.evictions += 1

    def _sample_resident(self, keys: list[Any], probe: bool = False) -> None:
        """Refine the estimate of a resident key's bytes from ``keys`` (a moving average; a
        probe sets it) and split the budget again."""
        sample = []
        for key in keys:
            size = _deep_size(key) + sys.getsizeof(self.resident[key][1]) + _RESIDENT_BYTES
            for t in self._primary:
                v = t.get(key, _MISSING)
                if v is not _MISSING:
                    size += _deep_size(v) + _ENTRY_SLOT_BYTES
            sample.append(size)
        if sample:
            est = sum(sample) / len(sample)
            self.resident_bytes = est if probe else 0.7 * self.resident_bytes + 0.3 * est
            self._rebudget()

    def release(self) -> None:
        """Write back every resident key's entries and drop them all."""
        if not self.resident:
            return
        self._check_open()
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        res = self.resident
        self._write_back_resident(list(res), batch, True)
        res.clear()
        self.touched.clear()
        self._fetched = []
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)

    def _rebudget(self) -> None:
        """Split the cache budget between resident keys and namespaced entries by their use."""
        if self._fixed:
            return
        left = self.cache_bytes - self.cached * self.entry_bytes
        self.resident_limit = max(MIN_CACHE_ENTRIES, int(left / self.resident_bytes))
        left = self.cache_bytes - len(self.resident) * self.resident_bytes
        self.limit = max(MIN_CACHE_ENTRIES, int(left / self.entry_bytes))

    # -- the cache budget ----------------------------------------------------------------------

    def grew(self) -> None:
        """One entry more is about to be cached: write back and drop old entries when over the
        budget (before the new entry is in: a state may mutate the entry it just got or set)."""
        self.cached += 1
        if self.cached > self.limit:
            self.evict()

    def evict(self) -> None:
        """Write back and drop the oldest :data:`EVICT_FRACTION` of every table's cache."""
        self._check_open()
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        sample: list[int] = []
        dropped = 0
        for t in self._tables:
            c = t.cache
            if not c:
                continue
            n = max(1, int(len(c) * EVICT_FRACTION)) if len(c) > 8 else len(c)
            victims = list(itertools.islice(c, n))
            for i, key in enumerate(victims):
                if i < 16:
                    v = c[key]
                    sample.append(_deep_size(key) + (0 if v is _TOMB else _deep_size(v)))
                t.write_back(key, batch)
                del c[key]
            dropped += len(victims)
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)
        self.cached -= dropped
        self.evictions += 1
        if sample and not self._fixed:  # refine the estimate of an entry's bytes (moving average)
            est = sum(sample) / len(sample) + _SLOT_BYTES
            self.entry_bytes = 0.7 * self.entry_bytes + 0.3 * est
            self._rebudget()

    def flush(self, table: DiskTable | None = None) -> None:
        """Write back every dirty entry (of ``table``, or of all tables and every resident
        key); entries stay cached and keys resident."""
        self._check_open()
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        if table is None:
            self._write_back_resident(list(self.resident), batch, False)
        for t in [table] if table is not None else self._tables:
            c = t.cache
            for key in list(t.dirty):
                t.write_back(key, batch)
                if c.get(key, None) is _TOMB:
                    del c[key]
                    self.cached -= 1
        if not batch.is_empty():
            self.written_back += batch.len()
            self._write(batch)

    # -- bulk paths ----------------------------------------------------------------------------

    def put_key_group(self, kg: int, rows: dict[str, list[tuple[list[bytes], list[bytes], list[Any]]]]) -> None:
        """Bulk-load the restored entries of one key group, or of a part of it (a slice, or the
        rest after slices), of every state (``state name -> [(key bytes, namespace bytes,
        entries)]``), uncached, in one write batch. Their keys hold nothing in the database
        yet (each key's restored entries are loaded once, before the key is set current)."""
        self._check_open()
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        records: dict[bytes, dict[int, Any]] = {}
        dumps, proto, none = _DUMPS, _PROTOCOL, NONE_NSB
        for state, parts in rows.items():
            sid = self.state_id(state)
            sidb = sid.to_bytes(2, "big")
            seen = self.namespaces.setdefault(state, set())
            for kbs, nss, entries in parts:
                seen.update(set(nss))
                for kb, nsb, e in zip(kbs, nss, entries, strict=True):
                    if nsb == none:
                        rec = records.get(kb)
                        if rec is None:
                            records[kb] = {sid: e}
                        else:
                            rec[sid] = e
                    else:
                        batch.put(_key_prefix(kg, kb) + sidb + nsb, dumps(e, proto))
        for kb, rec in records.items():
            batch.put(_key_prefix(kg, kb), dumps(rec, proto))
        if not batch.is_empty():
            self._write(batch)

    def put_rows(self, state: str, kbs: list[bytes], kgs: list[int], nss: list[bytes], entries: list[Any]) -> None:
        """Bulk-load restored entries of one state (merged into the records of their keys:
        a read per key; a restore by key group uses :meth:`put_key_group`)."""
        self._check_open()
        sid = self.state_id(state)
        sidb = sid.to_bytes(2, "big")
        self.namespaces.setdefault(state, set()).update(set(nss))
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        records: dict[bytes, dict[int, Any]] = {}
        for kb, kg, nsb, e in zip(kbs, kgs, nss, entries, strict=True):
            pre = _key_prefix(kg, kb)
            if nsb != NONE_NSB:
                batch.put(pre + sidb + nsb, _DUMPS(e, _PROTOCOL))
                continue
            rec = records.get(pre)
            if rec is None:
                raw = self.get(pre)
                rec = records[pre] = self.loads(raw) if raw is not None else {}
            rec[sid] = e
        for pre, rec in records.items():
            batch.put(pre, _DUMPS(rec, _PROTOCOL))
        if not batch.is_empty():
            self._write(batch)

    def scan(self, state: str, nsb: bytes | None = None) -> Iterator[tuple[bytes, bytes, Any]]:
        """``(key bytes, namespace bytes, entry)`` of a state's entries on disk, in key-group
        order (flush the cache first to see its dirty entries)."""
        self._check_open()
        sid = self._states.get(state)
        if sid is None:
            return
        try:
            it = self._db.iter(self._rocksdict.ReadOptions())
            it.seek_to_first()
            while it.valid():
                _kg, kb, s, ns = _split_key(it.key())
                if s == 0:  # a key's record: its default-namespace entries by state id
                    if nsb is None or nsb == NONE_NSB:
                        e = _LOADS(it.value()).get(sid, _MISSING)
                        if e is not _MISSING:
                            yield kb, NONE_NSB, e
                elif s == sid and (nsb is None or ns == nsb):
                    yield kb, ns, _LOADS(it.value())
                it.next()
            it.status()
        except StatelogError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None

    def drop_key_groups(self, lo: int, hi: int) -> None:
        """Delete every state's entries of key groups ``lo..hi`` (cached ones too)."""
        self._check_open()
        for t in self._tables:
            for key in [k for k, ki in t.key_groups_cached() if lo <= ki <= hi]:
                t.cache.pop(key, None)
                t.dirty.pop(key, None)
                self.cached -= 1
        res = self.resident
        for key in [k for k, info in res.items() if lo <= info[2] <= hi]:
            del res[key]
            self.touched.discard(key)
            self._present.discard(key)
            self._extra.pop(key, None)
            for d in self._primary:
                d.pop(key, None)
        try:
            self._db.delete_range(lo.to_bytes(2, "big"), (hi + 1).to_bytes(2, "big"))
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from None

    # -- lifecycle -----------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.path):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(dirpath, f))
        return total

    def stats(self) -> dict[str, Any]:
        return {
            "cached_entries": self.cached, "cache_limit": self.limit, "entry_bytes": round(self.entry_bytes),
            "resident_keys": len(self.resident), "resident_limit": self.resident_limit,
            "resident_key_bytes": round(self.resident_bytes),
            "reads": self.reads, "misses": self.misses, "prefetched": self.prefetched, "written_back": self.written_back,
            "evictions": self.evictions,
        }  # fmt: skip

    def _check_open(self) -> None:
        if self._closed:
            raise StatelogError("the disk-backed working set of this backend is closed")

    def close(self) -> None:
        """Close the database and delete its directory (the state lives in the checkpoints)."""
        if self._closed:
            return
        self._closed = True
        for t in self._tables:
            t.cache.clear()
            t.dirty.clear()
        self._tables.clear()
        self.resident.clear()
        self.touched.clear()
        self._fetched = []
        self._present.clear()
        self._extra.clear()
        for d in self._primary:
            d.clear()
        with contextlib.suppress(Exception):
            self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)


class DiskTable:
    """The entries of one state and namespace: a ``dict``-like cache over the database."""

    __slots__ = ("ws", "sid", "nsb", "mutable", "ctx", "cache", "dirty")

    def __init__(self, ws: WorkingSet, sid: int, nsb: bytes, mutable: bool, ctx: Any) -> None:
        self.ws = ws
        self.sid = sid
        self.nsb = nsb
        self.mutable = mutable
        self.ctx = ctx
        self.cache: dict[Any, Any] = {}
        # key -> key info (type, key bytes, key group) of entries to write back
        self.dirty: dict[Any, tuple[type, bytes, int]] = {}

    def __repr__(self) -> str:
        return f"DiskTable(state id {self.sid}, namespace {self.nsb!r}, {len(self.cache)} cached)"

    def _info(self, key: Any) -> tuple[type, bytes, int]:
        ctx = self.ctx
        if key is ctx.key:
            return ctx.key_info
        return self.ws.key_info(key)

    def _load(self, key: Any) -> Any:
        """A cache miss: read the entry from the database (cached if found)."""
        ws = self.ws
        ws.misses += 1
        ki = self._info(key)
        raw = ws.get(_disk_key(self.sid, ki[2], ki[1], self.nsb))
        if raw is None:
            return _MISSING
        v = ws.loads(raw)
        ws.grew()  # before caching: the entry returned must not be the one written back
        self.cache[key] = v
        return v

    def write_back(self, key: Any, batch: Any) -> None:
        ki = self.dirty.pop(key, None)
        if ki is None:
            return
        dk = _disk_key(self.sid, ki[2], ki[1], self.nsb)
        v = self.cache[key]
        if v is _TOMB:
            batch.delete(dk)
        else:
            batch.put(dk, _DUMPS(v, _PROTOCOL))

    def key_groups_cached(self) -> list[tuple[Any, int]]:
        return [(k, self._info(k)[2]) for k in self.cache]

    # -- the dict protocol the states and appliers use ----------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            v = self.cache[key]
        except KeyError:
            v = self._load(key)
            if v is _MISSING:
                return default
        if v is _TOMB:
            return default
        if self.mutable:  # the caller may mutate the entry in place
            ctx = self.ctx
            self.dirty[key] = ctx.key_info if key is ctx.key else self.ws.key_info(key)
        return v

    def __getitem__(self, key: Any) -> Any:
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __contains__(self, key: Any) -> bool:
        try:
            v = self.cache[key]
        except KeyError:
            v = self._load(key)
        return v is not _MISSING and v is not _TOMB

    def __setitem__(self, key: Any, value: Any) -> None:
        c = self.cache
        if key not in c:
            # make room first: the caller may go on mutating ``value`` (a new list or map)
            self.ws.grew()
        c[key] = value
        ctx = self.ctx  # _info() inlined: this runs once per update
        self.dirty[key] = ctx.key_info if key is ctx.key else self.ws.key_info(key)

    def __delitem__(self, key: Any) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        try:
            v = self.cache[key]
        except KeyError:
            v = self._load(key)
        if v is _MISSING or v is _TOMB:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self.cache[key] = _TOMB
        self.dirty[key] = self._info(key)
        return v

    def update(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        for k, v in pairs:
            self[k] = v

    def __bool__(self) -> bool:
        return True  # unknown without a scan: the state never drops a disk table as empty

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every entry (written back first), decoded keys, in key-group order."""
        self.ws.flush(self)
        state = next((n for n, s in self.ws._states.items() if s == self.sid), None)
        if state is None:
            return
        for kb, _ns, v in self.ws.scan(state, self.nsb):
            yield decode_key(kb), v

    def keys(self) -> Iterator[Any]:
        return (k for k, _v in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _k, v in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


class ResidentView:
    """A state's default-namespace dict for access to any key, not only the current one
    (restore replays its changelog tail through it): every access makes the key resident
    first, so the dict holds the key's entry as stored."""

    __slots__ = ("ws", "table")

    def __init__(self, ws: WorkingSet, table: dict[Any, Any]) -> None:
        self.ws = ws
        self.table = table

    def __repr__(self) -> str:
        return f"ResidentView({len(self.table)} resident entries)"

    def _admit(self, key: Any) -> None:
        ws = self.ws
        if key not in ws.resident:
            ws.admit(key, ws.key_info(key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._admit(key)
        return self.table.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._admit(key)
        return self.table[key]

    def __contains__(self, key: Any) -> bool:
        self._admit(key)
        return key in self.table

    def __setitem__(self, key: Any, value: Any) -> None:
        self._admit(key)
        self.table[key] = value

    def __delitem__(self, key: Any) -> None:
        self._admit(key)
        del self.table[key]

    def pop(self, key: Any, *default: Any) -> Any:
        self._admit(key)
        return self.table.pop(key, *default)

    def update(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        for k, v in pairs:
            self[k] = v
