"""Materializations: the keyed state of one checkpoint as open Parquet state tables.

A materialization is a full, consistent image of every operator's keyed state at one
completed checkpoint (format ``statelog.materialization`` v1, ``docs/format.md``). It
consists of Parquet files, one set per operator and state, each file covering a
key-group range and sorted by ``(key_group, key, namespace)``, and a manifest (versioned,
checksummed JSON, written last) that lists every file with its key-group range, rows,
bytes and CRC-32, the checkpoint id, and the changelog position per stream it covers.

This module holds the manifest model, the table schema (shared by the materializer that
writes tables and the restore path that reads them) and the verified reader. Files may be
shared between materializations: an incremental materialization references the unchanged
files of its base by their original path.
"""

from __future__ import annotations

import bisect
import io
import pickle
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from statelog import envelope
from statelog.changelog.format import TIMER_STATES
from statelog.checkpoint.metadata import MaterializedPart
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import CorruptionError, ObjectNotFoundError
from statelog.keys import KeyGroupRange
from statelog.layout import (
    MANIFEST_PREFIX,
    parse_manifest_key,
    parse_savepoint_manifest_key,
)
from statelog.store.base import ObjectStore
from statelog.types import PICKLE, arrow_type

MANIFEST_FORMAT = "statelog.materialization"
MANIFEST_VERSION = 1

# the Parquet schema metadata keys
META_FORMAT = b"statelog.table"
META_STATE = b"statelog.state"
META_KIND = b"statelog.kind"
META_VALUE_ENC = b"statelog.value_encoding"
META_UKEY_ENC = b"statelog.user_key_encoding"
TABLE_FORMAT = b"statelog.state-table.v1"


# -- manifest ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableFile:
    """One Parquet file of one state, covering ``key_groups``."""

    path: str
    key_groups: KeyGroupRange
    rows: int
    bytes: int
    crc32: int
    # ``(bytes, CRC-32)`` of the file's last bytes (the Parquet footer, its length and magic)
    # and the CRC-32 of each row group's bytes: a reader may fetch the footer and some row
    # groups only, each verified (docs/format.md section 9); None in files written before
    footer: tuple[int, int] | None = None
    row_group_crc32: tuple[int, ...] | None = None

    @staticmethod
    def of(path: str, key_groups: KeyGroupRange, rows: int, data: bytes) -> TableFile:
        """The manifest entry of table file ``data`` (checksums of the whole and of its parts)."""
        md = pq.ParquetFile(pa.BufferReader(data)).metadata
        tail = int.from_bytes(data[-8:-4], "little") + 8
        return TableFile(
            path, key_groups, rows, len(data), zlib.crc32(data), (tail, zlib.crc32(data[-tail:])),
            tuple(zlib.crc32(data[a:b]) for a, b in (row_group_span(md, i) for i in range(md.num_row_groups))),
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "path": self.path,
            "key_groups": self.key_groups.to_json(),
            "rows": self.rows,
            "bytes": self.bytes,
            "crc32": self.crc32,
        }
        if self.footer is not None and self.row_group_crc32 is not None:
            out["footer"] = list(self.footer)
            out["row_group_crc32"] = list(self.row_group_crc32)
        return out

    @staticmethod
    def from_json(obj: Any) -> TableFile:
        footer = obj.get("footer")
        crcs = obj.get("row_group_crc32")
        return TableFile(
            path=str(obj["path"]),
            key_groups=KeyGroupRange.from_json(obj["key_groups"]),
            rows=int(obj["rows"]),
            bytes=int(obj["bytes"]),
            crc32=int(obj["crc32"]),
            footer=None if footer is None else (int(footer[0]), int(footer[1])),
            row_group_crc32=None if crcs is None else tuple(int(c) for c in crcs),
        )


@dataclass(frozen=True)
class MaterializedOperator:
    """The tables of one operator uid in a materialization."""

    uid: str
    states: tuple[StateInfo, ...]
    covered: dict[str, int]  # changelog stream -> position [0, end) included
    files: dict[str, tuple[TableFile, ...]]  # state name -> files, ordered by key group

    def files_for(self, state: str, kgr: KeyGroupRange) -> list[TableFile]:
        return [f for f in self.files.get(state, ()) if not f.key_groups.intersect(kgr).is_empty]

    @property
    def rows(self) -> int:
        return sum(f.rows for fs in self.files.values() for f in fs)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for fs in self.files.values() for f in fs)

    def to_json(self) -> dict[str, Any]:
        return {
            "states": [s.to_json() for s in self.states],
            "covered": dict(sorted(self.covered.items())),
            "files": {name: [f.to_json() for f in fs] for name, fs in sorted(self.files.items())},
        }

    @staticmethod
    def from_json(uid: str, obj: Any) -> MaterializedOperator:
        return MaterializedOperator(
            uid=uid,
            states=tuple(StateInfo.from_json(s) for s in obj["states"]),
            covered={str(k): int(v) for k, v in obj["covered"].items()},
            files={str(n): tuple(TableFile.from_json(f) for f in fs) for n, fs in obj["files"].items()},
        )


@dataclass(frozen=True)
class Manifest:
    """A published materialization (or the image of a savepoint)."""

    mid: str
    key: str  # the manifest's object key
    checkpoint_id: int
    job_id: str
    max_parallelism: int
    created_ms: int
    lease_generation: int
    operators: dict[str, MaterializedOperator]
    kind: str = "materialization"  # or "savepoint"
    stats: dict[str, Any] = field(default_factory=dict)
    savepoint: str | None = None  # kind "savepoint": the savepoint's name
    # size and CRC-32 of the stored object (known once written or read; not part of the body)
    object_bytes: int | None = field(default=None, compare=False, repr=False)
    object_crc32: int | None = field(default=None, compare=False, repr=False)

    def paths(self) -> set[str]:
        return {f.path for op in self.operators.values() for fs in op.files.values() for f in fs}

    @property
    def rows(self) -> int:
        return sum(op.rows for op in self.operators.values())

    @property
    def bytes(self) -> int:
        return sum(op.bytes for op in self.operators.values())

    def describe(self) -> str:
        """What this manifest says it is, e.g. ``materialization m-... of checkpoint 4``."""
        what = f"{self.kind} {self.mid} of checkpoint {self.checkpoint_id}"
        return f"{what} (savepoint {self.savepoint!r})" if self.savepoint is not None else what

    def reference(self, key_groups: KeyGroupRange) -> MaterializedPart:
        """A reference to ``key_groups`` of this manifest, bound to its stored bytes if known."""
        return MaterializedPart(self.key, key_groups, self.object_bytes, self.object_crc32)

    def stored(self) -> tuple[bytes, Manifest]:
        """The bytes to store, and this manifest knowing their size and CRC-32."""
        data = self.to_bytes()
        return data, replace(self, object_bytes=len(data), object_crc32=zlib.crc32(data))

    def body(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "kind": self.kind,
            **({"savepoint": self.savepoint} if self.savepoint is not None else {}),
            "id": self.mid,
            "checkpoint_id": self.checkpoint_id,
            "job_id": self.job_id,
            "max_parallelism": self.max_parallelism,
            "created_ms": self.created_ms,
            "lease_generation": self.lease_generation,
            "stats": self.stats,
            "operators": {uid: op.to_json() for uid, op in sorted(self.operators.items())},
        }

    def to_bytes(self) -> bytes:
        return envelope.dump(self.body())

    @staticmethod
    def from_bytes(data: bytes, key: str) -> Manifest:
        body = envelope.load(data, key, "materialization manifest", fmt=MANIFEST_FORMAT, versions=(MANIFEST_VERSION,))
        try:
            m = Manifest(
                mid=str(body["id"]),
                key=key,
                checkpoint_id=int(body["checkpoint_id"]),
                job_id=str(body["job_id"]),
                max_parallelism=int(body["max_parallelism"]),
                created_ms=int(body["created_ms"]),
                lease_generation=int(body["lease_generation"]),
                operators={uid: MaterializedOperator.from_json(uid, op) for uid, op in body["operators"].items()},
                kind=str(body.get("kind", "materialization")),
                stats=dict(body.get("stats", {})),
                savepoint=None if body.get("savepoint") is None else str(body["savepoint"]),
                object_bytes=len(data),
                object_crc32=zlib.crc32(data),
            )
        except CorruptionError as e:
            if e.key is not None:
                raise
            raise CorruptionError(f"materialization manifest {key} is malformed: {e}", key=key) from None
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise CorruptionError(f"materialization manifest {key} is malformed: {e}", key=key) from None
        check_identity(m, key)
        return m


def check_identity(m: Manifest, key: str) -> None:
    """A manifest read from ``key`` must say it is the manifest that key names.

    ``materializations/manifests/<id>.json`` holds materialization ``<id>`` (kind, id,
    checkpoint and lease generation as in the name); ``savepoints/<name>/manifest.json``
    holds a savepoint's manifest, of savepoint ``<name>`` if it records its name (manifests
    written before the name was recorded do not). Other keys carry no identity.
    """
    parsed = parse_manifest_key(key)
    if parsed is not None:
        mid, cid, generation = parsed
        if (m.kind, m.mid, m.checkpoint_id, m.lease_generation) == ("materialization", mid, cid, generation):
            return
        expected = f"materialization {mid} of checkpoint {cid}"
    else:
        name = parse_savepoint_manifest_key(key)
        if name is None or (m.kind == "savepoint" and m.savepoint in (None, name)):
            return
        expected = f"the manifest of savepoint {name!r}"
    raise CorruptionError(
        f"materialization manifest {key} holds {m.describe()}, expected {expected}: another manifest was "
        "copied there; run `statelog verify ROOT` and restore a checkpoint or savepoint that does not "
        "build on it",
        key=key,
    )


def load_manifest(
    store: ObjectStore,
    ref: str | MaterializedPart,
    cache: dict[str, Manifest] | None = None,
    *,
    job_id: str | None = None,
) -> Manifest:
    """Read and verify a manifest (``cache`` keeps parsed manifests, they are immutable).

    ``ref`` is the manifest's object key or a reference to it; a reference that records the
    manifest's size and CRC-32 must match the stored bytes, and with ``job_id`` the manifest
    must belong to that job (both are checked on cache hits too: the cache may have been
    filled through another reference).
    """
    key = ref if isinstance(ref, str) else ref.manifest
    m = cache.get(key) if cache is not None else None
    if m is None:
        try:
            data = store.get(key)
        except ObjectNotFoundError:
            raise CorruptionError(
                f"materialization manifest {key} is missing from {store.url}; the checkpoint that references "
                "it cannot be restored (restore an older checkpoint or a savepoint)",
                key=key,
            ) from None
        m = Manifest.from_bytes(data, key)
        if cache is not None:
            cache[key] = m
    if isinstance(ref, MaterializedPart):
        check_reference(m, ref)
    if job_id is not None and m.job_id != job_id:
        raise CorruptionError(
            f"materialization manifest {key} belongs to job {m.job_id}, the metadata that references it to "
            f"job {job_id}: it was copied from another job root; run `statelog verify ROOT`",
            key=key,
        )
    return m


def check_reference(m: Manifest, ref: MaterializedPart) -> None:
    """The manifest's stored bytes must be those ``ref`` recorded (if it recorded them)."""
    if ref.bytes is None or ref.crc32 is None or m.object_bytes is None or m.object_crc32 is None:
        return
    if (m.object_bytes, m.object_crc32) != (ref.bytes, ref.crc32):
        raise CorruptionError(
            f"materialization manifest {m.key} ({m.describe()}) is {m.object_bytes} bytes with CRC-32 "
            f"{m.object_crc32:08x}, but the checkpoint or savepoint metadata that references it recorded "
            f"{ref.bytes} bytes with CRC-32 {ref.crc32:08x}: other bytes are in its place; run "
            "`statelog verify ROOT` and restore a checkpoint or savepoint that does not build on it",
            key=m.key,
        )


def list_manifests(store: ObjectStore) -> list[tuple[str, int, int, float]]:
    """``(object key, checkpoint id, generation, mtime)`` of every published manifest, oldest first."""
    out = []
    for obj in store.list(MANIFEST_PREFIX):
        parsed = parse_manifest_key(obj.key)
        if parsed is not None:
            out.append((obj.key, parsed[1], parsed[2], obj.mtime))
    out.sort(key=lambda t: (t[1], t[2], t[3]))
    return out


def latest_manifest_key(store: ObjectStore) -> str | None:
    """The newest materialization: highest checkpoint id, then highest lease generation."""
    ms = list_manifests(store)
    return ms[-1][0] if ms else None


# -- table schema ------------------------------------------------------------------------------


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


def row_group_bounds(key_groups: np.ndarray, max_rows: int | None = None, min_rows: int | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` row ranges of the row groups of a table sorted by key group: a key
    group of ``min_rows`` rows or more has row groups of its own, of at most ``max_rows`` rows
    each (a reader of that key group alone decodes none of its neighbours' rows, and an
    on-demand restore can load it a row group at a time); smaller key groups share row groups,
    each ending at a key group's end once it holds ``min_rows`` rows."""
    max_rows = ROW_GROUP_ROWS if max_rows is None else max_rows
    min_rows = MIN_ROW_GROUP_ROWS if min_rows is None else min_rows
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


def encode_parquet(table: pa.Table, row_group_rows: int | None = None) -> bytes:
    """A state table's Parquet bytes (docs/format.md section 9); ``table`` sorted by key group."""
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
        bounds = row_group_bounds(table.column("key_group").to_numpy(), row_group_rows)
        for start, end in bounds or [(0, 0)]:
            writer.write_table(table.slice(start, end - start), row_group_size=max(1, end - start))
    return buf.getvalue()


def _holds_any(sorted_kgs: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_left(sorted_kgs, lo)
    return i < len(sorted_kgs) and sorted_kgs[i] <= hi


def _holds_all(sorted_kgs: list[int], lo: int, hi: int) -> bool:
    i = bisect.bisect_left(sorted_kgs, lo)
    return i + (hi - lo) < len(sorted_kgs) and sorted_kgs[i + (hi - lo)] == hi and sorted_kgs[i] == lo


def read_table_file(
    store: ObjectStore, f: TableFile, kgr: KeyGroupRange, info: StateInfo | None = None
) -> pa.Table:
    """Read one verified table file, only the row groups overlapping ``kgr``, rows filtered to it."""
    return decode_table_file(fetch_table_file(store, f), f, kgr, info)


def _missing(store: ObjectStore, f: TableFile) -> CorruptionError:
    return CorruptionError(
        f"state table {f.path} is missing from {store.url}; the materialization that lists it cannot "
        "be restored (restore an older checkpoint or a savepoint)",
        key=f.path,
    )


def fetch_table_file(store: ObjectStore, f: TableFile) -> bytes:
    """The bytes of a table file, checked against the size and CRC-32 its manifest recorded."""
    try:
        data = store.get(f.path)
    except ObjectNotFoundError:
        raise _missing(store, f) from None
    if len(data) != f.bytes or zlib.crc32(data) != f.crc32:
        raise CorruptionError(
            f"state table {f.path}: size or CRC-32 does not match the manifest; the file is corrupt",
            key=f.path,
        )
    return data


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


RANGED_MIN_BYTES = 1 << 20  # a table file of this size or more may be read in ranges
FOOTER_READ_BYTES = 64 << 10  # the bytes Arrow reads first from a Parquet file's end


class RangedTableFile:
    """A table file read in verified parts: its footer first (the manifest's ``footer``
    checksum), then the row groups a reader needs (each against its CRC-32 in the manifest),
    by ranged reads; an on-demand restore touching one key group of a large file fetches that
    key group's row groups instead of the whole file. Thread-safe; pass it where a table
    file's verified bytes go (:func:`decode_table_file`, :func:`decode_key_range`,
    :func:`key_slices`)."""

    def __init__(self, store: ObjectStore, f: TableFile, on_fetch: Callable[[int], None] | None = None) -> None:
        """``on_fetch`` is called with the bytes of each read."""
        assert f.footer is not None and f.row_group_crc32 is not None
        self.store, self.f, self._on_fetch = store, f, on_fetch
        self._lock = threading.Lock()
        tail_bytes, crc = f.footer
        n = min(f.bytes, max(FOOTER_READ_BYTES, tail_bytes))
        tail = self._get(f.bytes - n, n)
        if tail_bytes > n or zlib.crc32(tail[n - tail_bytes:]) != crc:
            raise CorruptionError(f"state table {f.path}: its footer does not match the manifest's checksum; "
                                  "the file is corrupt", key=f.path)  # fmt: skip
        self._parts: list[tuple[int, bytes]] = [(f.bytes - n, tail)]
        self._verified: set[int] = set()
        self.metadata = pq.ParquetFile(pa.PythonFile(_Parts(self), mode="r")).metadata  # parsed from the footer
        if self.metadata.num_row_groups != len(f.row_group_crc32):
            raise CorruptionError(f"state table {f.path}: {self.metadata.num_row_groups} row groups, the "
                                  f"manifest lists {len(f.row_group_crc32)}; the file is corrupt", key=f.path)  # fmt: skip

    def reader(self) -> pq.ParquetFile:
        """A Parquet reader of the parts fetched, for one thread: Arrow's reader pre-buffers the
        row groups a read asks for in a cache of its own, which a read from another thread
        would replace; each decode opens one (with the footer already parsed)."""
        return pq.ParquetFile(pa.PythonFile(_Parts(self), mode="r"), metadata=self.metadata,
                              page_checksum_verification=True)  # fmt: skip

    def _get(self, offset: int, length: int) -> bytes:
        try:
            data = self.store.get_range(self.f.path, offset, length)
        except ObjectNotFoundError:
            raise _missing(self.store, self.f) from None
        if len(data) != length:
            raise CorruptionError(f"state table {self.f.path}: shorter than the manifest's {self.f.bytes} bytes",
                                  key=self.f.path)  # fmt: skip
        if self._on_fetch is not None:
            self._on_fetch(length)
        return data

    def need(self, groups: Iterable[int]) -> None:
        """Fetch and verify row groups ``groups`` unless held (adjacent ones in one read)."""
        md = self.metadata
        with self._lock:
            todo = sorted(set(groups) - self._verified)
            runs: list[list[int]] = []
            for i in todo:
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            for run in runs:
                spans = [row_group_span(md, i) for i in run]
                start, end = spans[0][0], spans[-1][1]
                data = self._get(start, end - start)
                for i, (a, b) in zip(run, spans, strict=True):
                    if zlib.crc32(data[a - start : b - start]) != self.f.row_group_crc32[i]:
                        raise CorruptionError(f"state table {self.f.path}: row group {i} does not match the "
                                              "manifest's checksum; the file is corrupt", key=self.f.path)  # fmt: skip
                self._parts.append((start, data))
                self._verified.update(run)

    def read(self, offset: int, n: int) -> bytes:
        """Bytes ``[offset, offset + n)`` from the parts fetched (Arrow reads several row
        groups at once: a read may span parts fetched apart)."""
        out, pos, end = [], offset, offset + n
        for start, data in sorted(self._parts, key=lambda p: p[0]):
            stop = start + len(data)
            if start <= pos < stop:
                out.append(data[pos - start : min(end, stop) - start])
                pos = min(end, stop)
                if pos == end:
                    return out[0] if len(out) == 1 else b"".join(out)
        if n == 0:
            return b""
        raise RuntimeError(f"state table {self.f.path}: bytes {offset}+{n} read before they were fetched")


class _Parts:
    """The Python file Arrow reads a :class:`RangedTableFile` through (fetched parts only)."""

    closed = False

    def __init__(self, owner: RangedTableFile) -> None:
        self._owner, self._pos = owner, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def size(self) -> int:
        return self._owner.f.bytes

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self._pos + pos if whence == 1 else self._owner.f.bytes + pos
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self._owner.f.bytes - self._pos
        data = self._owner.read(self._pos, n)
        self._pos += n
        return data


def _need(data: bytes | RangedTableFile, groups: Iterable[int]) -> None:
    if isinstance(data, RangedTableFile):
        data.need(groups)


def decode_table_file(
    data: bytes | RangedTableFile, f: TableFile, kgr: KeyGroupRange, info: StateInfo | None = None,
    only: list[int] | None = None,
) -> pa.Table:
    """The rows of ``kgr`` (with ``only``: of those sorted key groups of it) of a table file's
    verified bytes; only the row groups holding them are decoded; Parquet page checksums are
    checked."""
    pf = _open_verified(data, f)
    try:
        inter = f.key_groups.intersect(kgr)
        if inter == f.key_groups and only is None:
            _need(data, range(pf.metadata.num_row_groups))
            table = pf.read()
        else:
            groups = []
            exact = True  # every row of the row groups read is wanted: no filter needed
            md = pf.metadata
            for i in range(md.num_row_groups):
                st = md.row_group(i).column(0).statistics
                if st is None or not st.has_min_max:
                    groups.append(i)
                    exact = False
                elif kgr.overlaps(st.min, st.max) and (only is None or _holds_any(only, st.min, st.max)):
                    groups.append(i)
                    exact = exact and kgr.start <= st.min and st.max <= kgr.end and (
                        only is None or _holds_all(only, st.min, st.max)
                    )
            _need(data, groups)
            table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
            if not exact:
                kg = table.column("key_group")
                if only is None:
                    table = table.filter(pc.and_(pc.greater_equal(kg, kgr.start), pc.less_equal(kg, kgr.end)))
                else:
                    table = table.filter(pc.is_in(kg, pa.array(only, kg.type)))
    except (OSError, pa.ArrowException) as e:
        raise CorruptionError(f"state table {f.path} cannot be read: {e}", key=f.path) from None
    return _of_state(table, f, info)


def _of_state(table: pa.Table, f: TableFile, info: StateInfo | None) -> pa.Table:
    """``table``, refused unless it holds the rows of state ``info`` (when given)."""
    if table.num_rows != 0 and info is not None and table.schema.metadata.get(META_STATE) != info.name.encode():
        raise CorruptionError(f"state table {f.path} does not hold state {info.name!r}", key=f.path)
    return table


def _open_verified(data: bytes | RangedTableFile, f: TableFile) -> pq.ParquetFile:
    if isinstance(data, RangedTableFile):
        return data.reader()
    try:
        return pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:
        raise CorruptionError(f"state table {f.path} cannot be read: {e}", key=f.path) from None


def key_slices(data: bytes | RangedTableFile, f: TableFile, kg: int) -> list[bytes]:
    """The smallest keys of the row groups that hold key group ``kg`` alone, but the first:
    bounds that cut the key group's keys into slices of about a row group each (an on-demand
    restore loads a slice, :func:`decode_key_range`, instead of the whole key group). Empty
    when the file has fewer than two such row groups, or no statistics on ``key``."""
    pf = _open_verified(data, f)
    md, ki = pf.metadata, pf.schema_arrow.get_field_index("key")
    mins = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        st, ks = rg.column(0).statistics, rg.column(ki).statistics
        if st is None or not st.has_min_max or not (st.min == st.max == kg):
            continue
        if ks is None or not ks.has_min_max:
            return []
        mins.append(ks.min)
    return sorted(mins)[1:]


def key_range_mask(keys: Any, lo: bytes | None, hi: bytes | None) -> Any:
    """``lo <= key < hi`` (``None``: unbounded) of a binary key column, bytewise."""
    masks = []
    if lo is not None:
        masks.append(pc.greater_equal(keys, pa.scalar(lo, pa.binary())))
    if hi is not None:
        masks.append(pc.less(keys, pa.scalar(hi, pa.binary())))
    if not masks:
        return pa.array([True] * len(keys), pa.bool_())
    return masks[0] if len(masks) == 1 else pc.and_(masks[0], masks[1])


def decode_key_range(
    data: bytes | RangedTableFile, f: TableFile, kg: int, lo: bytes | None, hi: bytes | None, info: StateInfo | None = None
) -> pa.Table:
    """The rows of key group ``kg`` with ``lo <= key < hi`` (``None``: unbounded) of a table
    file's verified bytes: only the row groups that may hold them are decoded (by the
    statistics of ``key_group`` and ``key``; a row group without them is decoded and
    filtered); Parquet page checksums are checked."""
    pf = _open_verified(data, f)
    try:
        md, ki = pf.metadata, pf.schema_arrow.get_field_index("key")
        groups = []
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            st = rg.column(0).statistics
            if st is not None and st.has_min_max:
                if not (st.min <= kg <= st.max):
                    continue
                ks = rg.column(ki).statistics
                known = st.min == st.max and ks is not None and ks.has_min_max  # its keys' range
                if known and ((hi is not None and ks.min >= hi) or (lo is not None and ks.max < lo)):
                    continue
            groups.append(i)
        _need(data, groups)
        table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
        mask = key_range_mask(table.column("key"), lo, hi)
        table = table.filter(pc.and_(mask, pc.equal(table.column("key_group"), kg)))
    except (OSError, pa.ArrowException) as e:
        raise CorruptionError(f"state table {f.path} cannot be read: {e}", key=f.path) from None
    return _of_state(table, f, info)
