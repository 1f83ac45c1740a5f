"""The materialization manifest (format ``statelog.materialization`` v1, docs/format.md section 8).

A manifest is versioned, checksummed JSON, written last: it lists every table file of a
materialization (or of a savepoint's image) per operator and state, with its key-group
range, rows, bytes and CRC-32s, the checkpoint it is the image of, and the changelog
position per stream it covers. This module holds the model, its checks (a manifest is the
one its key names and the one a reference recorded) and the listing and loading of the
published manifests.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from statelog import envelope
from statelog.checkpoint.metadata import MaterializedPart
from statelog.descriptors import StateInfo
from statelog.errors import CorruptionError, ObjectNotFoundError
from statelog.keys.groups import KeyGroupRange
from statelog.layout import (
    MANIFEST_PREFIX,
    parse_manifest_key,
    parse_savepoint_manifest_key,
)
from statelog.materialization.table_schema import row_group_span
from statelog.store.base import ObjectStore

MANIFEST_FORMAT = "statelog.materialization"
MANIFEST_VERSION = 1


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


    def missing(self, store: ObjectStore) -> CorruptionError:
        """The error of this file missing from ``store`` (what it means, what to do)."""
        return CorruptionError(
            f"state table {self.path} is missing from {store.url}; the materialization that lists it cannot "
            "be restored (restore an older checkpoint or a savepoint)",
            key=self.path,
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
        size, crc = (ref.bytes, ref.crc32) if isinstance(ref, MaterializedPart) else (None, None)
        try:  # a local copy only if it is the bytes the reference records
            data = store.get_expected(key, size, crc) if size is not None and crc is not None else store.get(key)
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
