"""What lives under a job root: the one module that builds and parses every object key.

After LevelDB's ``db/filename.h``: every writer builds its object keys here and every reader
(listing, GC, verification, display) parses them here, so the layout is written once.
``docs/format.md`` section 1 lists the same patterns, each with its parser and format::

    job.json                                                  job descriptor
    checkpoints/chk-<id %012d>.json                           checkpoint metadata
    changelog/<writer id>/<segment no %010d>.seg              changelog segment
    materializations/manifests/<materialization id>.json      materialization manifest
    materializations/data/<materialization id>/<file>.parquet state table
    savepoints/<name>/_metadata.json                          savepoint metadata
    savepoints/<name>/manifest.json                           savepoint manifest
    savepoints/<name>/data/<materialization id>/<file>.parquet savepoint state table
    materializer/lease/<lease object>                         the materializer's leader lease
    materializer/status/<owner hash %08x>.json                a materializer daemon's status
    writer/lease/<lease object>                               the writer lease
    runtime/inflight/chk-<id>/<vertex>.<subtask>.bin          in-flight data (runtime)
    full-snapshots/<uid>/<subtask %05d>/<id %012d>.snapshot   state dump (the runtime baseline of bench/)
    full-snapshots/<label>.snapshot                           state dump (benchmarks)
    history/checkpoints/seg-<n %012d>-<entries %05d>.jsonl    checkpoint history segment

with ``<materialization id>`` = ``m-<checkpoint id %012d>-<lease generation %06d>-<8 hex>``,
``<writer id>`` = ``<ms since epoch %013d>-<12 hex>``, ``<lease object>`` one of
``gen-<g %012d>.json``, ``gen-<g %012d>.renew-<n %012d>.json`` and ``gen-<g %012d>.released``,
and ``<file>`` = ``<op index %03d>-<state name, sanitized>-<CRC-32 of the name %08x>-kg<first
key group %05d>-<last %05d>``.

:func:`parse_key` classifies any key (``None``: not a statelog object); the ``parse_*``
functions of one kind return ``None`` for keys of other kinds.
"""

# size: the one module of every key pattern (docs/format.md section 1); splitting it would spread them

from __future__ import annotations

import enum
import re
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from statelog.errors import ConfigError
from statelog.keys.groups import KeyGroupRange

__all__ = [
    "CHANGELOG_PREFIX",
    "CHECKPOINT_PREFIX",
    "DATA_PREFIX",
    "INFLIGHT_PREFIX",
    "JOB_KEY",
    "MANIFEST_PREFIX",
    "MATERIALIZATIONS_PREFIX",
    "MATERIALIZER_LEASE_PREFIX",
    "SAVEPOINT_PREFIX",
    "STATE_DUMP_PREFIX",
    "WRITER_LEASE_PREFIX",
    "HISTORY_PREFIX",
    "FOLLOWER_LEASE_PREFIX",
    "MATERIALIZER_STATUS_PREFIX",
    "ObjectKey",
    "ObjectKind",
    "bench_state_dump_key",
    "check_savepoint_name",
    "checkpoint_key",
    "history_segment_key",
    "inflight_key",
    "is_materializer_status_key",
    "lease_generation_key",
    "lease_released_key",
    "lease_renewal_key",
    "follower_lease_key",
    "materializer_status_key",
    "manifest_key",
    "new_materialization_id",
    "new_writer_id",
    "parse_checkpoint_key",
    "parse_history_segment_key",
    "parse_inflight_key",
    "parse_key",
    "parse_lease_name",
    "parse_manifest_key",
    "parse_follower_lease_key",
    "parse_materializer_status_key",
    "parse_savepoint_manifest_key",
    "parse_savepoint_metadata_key",
    "parse_segment_key",
    "parse_state_dump_key",
    "parse_table_key",
    "savepoint_data_prefix",
    "savepoint_manifest_key",
    "savepoint_metadata_key",
    "savepoint_prefix",
    "savepoint_marker_key",
    "segment_key",
    "state_dump_dir",
    "state_dump_key",
    "table_dir",
    "table_file_key",
]

JOB_KEY = "job.json"
CHECKPOINT_PREFIX = "checkpoints/"
CHANGELOG_PREFIX = "changelog/"
MATERIALIZATIONS_PREFIX = "materializations/"
MANIFEST_PREFIX = "materializations/manifests/"
DATA_PREFIX = "materializations/data/"
SAVEPOINT_PREFIX = "savepoints/"
MATERIALIZER_LEASE_PREFIX = "materializer/lease/"
WRITER_LEASE_PREFIX = "writer/lease/"
INFLIGHT_PREFIX = "runtime/inflight/"
STATE_DUMP_PREFIX = "full-snapshots/"  # state dumps of the benchmarks (bench/baselines/)
HISTORY_PREFIX = "history/checkpoints/"
MATERIALIZER_STATUS_PREFIX = "materializer/status/"
FOLLOWER_LEASE_PREFIX = "followers/"

_MID = r"m-\d{12,}-\d{6,}-[0-9a-f]{8}"
_SAVEPOINT_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
_TABLE_FILE = r"\d{3,}-[A-Za-z0-9._-]{1,60}-[0-9a-f]{8}-kg\d{5,}-\d{5,}\.parquet"

_CHECKPOINT_RE = re.compile(r"^checkpoints/chk-(\d{12,})\.json$")
_SEGMENT_RE = re.compile(r"^changelog/(\d{13,}-[0-9a-f]{12})/(\d{10,})\.seg$")
_MANIFEST_RE = re.compile(r"^materializations/manifests/(m-(\d{12,})-(\d{6,})-([0-9a-f]{8}))\.json$")
_TABLE_RE = re.compile(rf"^materializations/data/({_MID})/({_TABLE_FILE})$")
_SAVEPOINT_NAME_RE = re.compile(rf"^{_SAVEPOINT_NAME}$")
_SAVEPOINT_METADATA_RE = re.compile(rf"^savepoints/({_SAVEPOINT_NAME})/_metadata\.json$")
_SAVEPOINT_MANIFEST_RE = re.compile(rf"^savepoints/({_SAVEPOINT_NAME})/manifest\.json$")
_SAVEPOINT_TABLE_RE = re.compile(rf"^savepoints/({_SAVEPOINT_NAME})/data/({_MID})/({_TABLE_FILE})$")
_LEASE_GEN_RE = re.compile(r"^gen-(\d{12,})\.json$")
_LEASE_RENEW_RE = re.compile(r"^gen-(\d{12,})\.renew-(\d{12,})\.json$")
_LEASE_RELEASED_RE = re.compile(r"^gen-(\d{12,})\.released$")
_INFLIGHT_RE = re.compile(r"^runtime/inflight/chk-(\d+)/((\d+)\.(\d+))\.bin$")
_STATE_DUMP_RE = re.compile(r"^full-snapshots/(.+)/(\d{5,})/(\d{12,})\.snapshot$")  # a uid may hold "/"
_BENCH_DUMP_RE = re.compile(r"^full-snapshots/([^/]+)\.snapshot$")
_HISTORY_RE = re.compile(r"^history/checkpoints/seg-(\d{12,})-(\d{5,})\.jsonl$")
_STATUS_RE = re.compile(r"^materializer/status/([0-9a-f]{8})-(\d{13,})\.json$")
_FOLLOWER_RE = re.compile(r"^followers/(f-[0-9a-f]{16})/(\d{12,})\.json$")


class ObjectKind(enum.Enum):
    """What an object below a job root is; the value names it in messages."""

    JOB = "job descriptor"
    CHECKPOINT = "checkpoint metadata"
    SEGMENT = "changelog segment"
    MANIFEST = "materialization manifest"
    TABLE = "state table"
    SAVEPOINT_METADATA = "savepoint metadata"
    SAVEPOINT_MANIFEST = "savepoint manifest"
    SAVEPOINT_TABLE = "savepoint state table"
    LEASE = "lease object"
    INFLIGHT = "in-flight data"
    STATE_DUMP = "state dump"
    HISTORY = "checkpoint history segment"
    MATERIALIZER_STATUS = "materializer status"
    FOLLOWER_LEASE = "follower lease"


@dataclass(frozen=True)
class ObjectKey:
    """A parsed object key: its kind and the fields its name carries (others ``None``)."""

    kind: ObjectKind
    key: str
    checkpoint_id: int | None = None  # checkpoint, manifest, table, in-flight data, state dump
    writer_id: str | None = None  # segment
    segment: int | None = None  # segment
    materialization_id: str | None = None  # manifest, table, savepoint table
    generation: int | None = None  # manifest (materializer lease generation), lease object
    savepoint: str | None = None  # savepoint objects
    file: str | None = None  # table file name
    lease: str | None = None  # lease object: the lease's prefix
    lease_object: str | None = None  # lease object: "acquire", "renew" or "released"
    renewal: int | None = None  # lease object "renew": the renewal number
    task: str | None = None  # in-flight data: "<vertex>.<subtask>"
    operator_uid: str | None = None  # state dump of the runtime baseline
    subtask: int | None = None  # in-flight data, state dump
    segment_no: int | None = None  # checkpoint history segment: its number and entries
    entries: int | None = None


# -- job descriptor and checkpoints -----------------------------------------------------------


def checkpoint_key(checkpoint_id: int) -> str:
    return f"{CHECKPOINT_PREFIX}chk-{checkpoint_id:012d}.json"


def parse_checkpoint_key(key: str) -> int | None:
    """The checkpoint id of ``checkpoints/chk-<id>.json``, else ``None``."""
    m = _CHECKPOINT_RE.match(key)
    return None if m is None else int(m.group(1))


# -- changelog ----------------------------------------------------------------------------------


def new_writer_id() -> str:
    """Writer ids sort by creation time: ``<ms since epoch, 13 digits>-<random hex>``."""
    return f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}"


def segment_key(writer_id: str, segment: int) -> str:
    return f"{CHANGELOG_PREFIX}{writer_id}/{segment:010d}.seg"


def parse_segment_key(key: str) -> tuple[str, int] | None:
    """``(writer id, segment number)`` of a changelog segment key, else ``None``."""
    m = _SEGMENT_RE.match(key)
    return None if m is None else (m.group(1), int(m.group(2)))


# -- materializations ---------------------------------------------------------------------------


def new_materialization_id(checkpoint_id: int, generation: int) -> str:
    return f"m-{checkpoint_id:012d}-{generation:06d}-{uuid.uuid4().hex[:8]}"


def manifest_key(mid: str) -> str:
    return f"{MANIFEST_PREFIX}{mid}.json"


def parse_manifest_key(key: str) -> tuple[str, int, int] | None:
    """``(id, checkpoint id, lease generation)`` of a manifest object key, else ``None``."""
    m = _MANIFEST_RE.match(key)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def table_dir(mid: str, data_prefix: str = DATA_PREFIX) -> str:
    """The directory of materialization ``mid``'s new table files below ``data_prefix``
    (:data:`DATA_PREFIX`, or a savepoint's :func:`savepoint_data_prefix`)."""
    return f"{data_prefix}{mid}/"


def table_file_key(directory: str, op_index: int, state: str, key_groups: KeyGroupRange) -> str:
    """The key of the table file of state ``state`` of the ``op_index``-th operator covering
    ``key_groups``, in ``directory`` (a :func:`table_dir`)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in state)[:60]
    crc = zlib.crc32(state.encode())
    return f"{directory}{op_index:03d}-{safe}-{crc:08x}-kg{key_groups.start:05d}-{key_groups.end:05d}.parquet"


def parse_table_key(key: str) -> tuple[str | None, str, str] | None:
    """``(savepoint name or None, materialization id, file name)`` of a state table key."""
    m = _TABLE_RE.match(key)
    if m is not None:
        return None, m.group(1), m.group(2)
    m = _SAVEPOINT_TABLE_RE.match(key)
    return None if m is None else (m.group(1), m.group(2), m.group(3))


# -- savepoints ---------------------------------------------------------------------------------


def check_savepoint_name(name: Any) -> str:
    if not isinstance(name, str) or not _SAVEPOINT_NAME_RE.match(name):
        raise ConfigError(
            f"invalid savepoint name {name!r}: use 1-100 characters of letters, digits, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return name


def savepoint_prefix(name: str) -> str:
    return f"{SAVEPOINT_PREFIX}{name}/"


def savepoint_marker_key(name: str, n: int = 0) -> str:
    """The ``n``-th in-progress marker of a write of savepoint ``name`` (docs/format.md section 1)."""
    return f"{savepoint_prefix(name)}_writing-{n:08d}.json"


def savepoint_data_prefix(name: str) -> str:
    return f"{SAVEPOINT_PREFIX}{name}/data/"


def savepoint_manifest_key(name: str) -> str:
    return f"{SAVEPOINT_PREFIX}{name}/manifest.json"


def savepoint_metadata_key(name: str) -> str:
    return f"{SAVEPOINT_PREFIX}{name}/_metadata.json"


def parse_savepoint_manifest_key(key: str) -> str | None:
    """The savepoint name of ``savepoints/<name>/manifest.json``, else ``None``."""
    m = _SAVEPOINT_MANIFEST_RE.match(key)
    return None if m is None else m.group(1)


def parse_savepoint_metadata_key(key: str) -> str | None:
    """The savepoint name of ``savepoints/<name>/_metadata.json``, else ``None``."""
    m = _SAVEPOINT_METADATA_RE.match(key)
    return None if m is None else m.group(1)


# -- leases (below a lease prefix such as MATERIALIZER_LEASE_PREFIX) -----------------------------


def lease_generation_key(prefix: str, generation: int) -> str:
    return f"{prefix}gen-{generation:012d}.json"


def lease_renewal_key(prefix: str, generation: int, seq: int) -> str:
    return f"{prefix}gen-{generation:012d}.renew-{seq:012d}.json"


def lease_released_key(prefix: str, generation: int) -> str:
    return f"{prefix}gen-{generation:012d}.released"


def parse_lease_name(name: str) -> tuple[str, int, int | None] | None:
    """``(object, generation, renewal number or None)`` of a lease object's name below its
    prefix, ``object`` being ``"acquire"``, ``"renew"`` or ``"released"``; else ``None``."""
    if m := _LEASE_GEN_RE.match(name):
        return "acquire", int(m.group(1)), None
    if m := _LEASE_RENEW_RE.match(name):
        return "renew", int(m.group(1)), int(m.group(2))
    if m := _LEASE_RELEASED_RE.match(name):
        return "released", int(m.group(1)), None
    return None


# -- runtime ------------------------------------------------------------------------------------


def inflight_key(checkpoint_id: int, task: str) -> str:
    """The in-flight data of task ``<vertex>.<subtask>`` in unaligned checkpoint ``checkpoint_id``."""
    return f"{INFLIGHT_PREFIX}chk-{checkpoint_id}/{task}.bin"


def parse_inflight_key(key: str) -> tuple[int, str] | None:
    """``(checkpoint id, task)`` of an in-flight data key, else ``None``."""
    m = _INFLIGHT_RE.match(key)
    return None if m is None else (int(m.group(1)), m.group(2))


def state_dump_dir(uid: str, subtask: int) -> str:
    return f"{STATE_DUMP_PREFIX}{uid}/{subtask:05d}/"


def state_dump_key(uid: str, subtask: int, checkpoint_id: int) -> str:
    """The state dump of the runtime's baseline for subtask ``subtask`` of operator ``uid``."""
    return f"{state_dump_dir(uid, subtask)}{checkpoint_id:012d}.snapshot"


def bench_state_dump_key(label: str) -> str:
    """A state dump written by the benchmarks (``bench/``)."""
    return f"{STATE_DUMP_PREFIX}{label}.snapshot"


def parse_state_dump_key(key: str) -> tuple[str, int, int] | None:
    """``(uid, subtask, checkpoint id)`` of a runtime state dump key, else ``None``."""
    m = _STATE_DUMP_RE.match(key)
    return None if m is None else (m.group(1), int(m.group(2)), int(m.group(3)))


# -- checkpoint history and daemon status (docs/format.md sections 12 and 13) ------------------


def history_segment_key(n: int, entries: int) -> str:
    """Segment ``n`` of the checkpoint history holding its first ``entries`` entries."""
    return f"{HISTORY_PREFIX}seg-{n:012d}-{entries:05d}.jsonl"


def parse_history_segment_key(key: str) -> tuple[int, int] | None:
    """``(segment number, entries)`` of a checkpoint history key, else ``None``."""
    m = _HISTORY_RE.match(key)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def materializer_status_key(owner: str, time_ms: int) -> str:
    """The status object the daemon named ``owner`` wrote at ``time_ms`` (a hash of the name:
    any text is safe; objects are write-once, so each write has its own key)."""
    return f"{MATERIALIZER_STATUS_PREFIX}{zlib.crc32(owner.encode()):08x}-{time_ms:013d}.json"


def parse_materializer_status_key(key: str) -> tuple[str, int] | None:
    """``(owner hash, time_ms)`` of a status object's key, ``None`` for any other key."""
    m = _STATUS_RE.match(key)
    return (m.group(1), int(m.group(2))) if m else None


def follower_lease_key(follower_id: str, n: int) -> str:
    """The ``n``-th write of the lease of follower ``follower_id`` (``f-<16 hex>``): the
    checkpoints it pins (objects are write-once: each write has its own key)."""
    return f"{FOLLOWER_LEASE_PREFIX}{follower_id}/{n:012d}.json"


def parse_follower_lease_key(key: str) -> tuple[str, int] | None:
    """``(follower id, n)`` of a follower lease's key, ``None`` for any other key."""
    m = _FOLLOWER_RE.match(key)
    return (m.group(1), int(m.group(2))) if m else None


def is_materializer_status_key(key: str) -> bool:
    return _STATUS_RE.match(key) is not None


# -- any key ------------------------------------------------------------------------------------


def parse_key(key: str) -> ObjectKey | None:
    """What the object ``key`` below a job root is; ``None`` for a key no statelog module writes."""
    head = key.partition("/")[0]
    if key == JOB_KEY:
        return ObjectKey(ObjectKind.JOB, key)
    if head == "checkpoints":
        cid = parse_checkpoint_key(key)
        return None if cid is None else ObjectKey(ObjectKind.CHECKPOINT, key, checkpoint_id=cid)
    if head == "changelog":
        seg = parse_segment_key(key)
        return None if seg is None else ObjectKey(ObjectKind.SEGMENT, key, writer_id=seg[0], segment=seg[1])
    if head == "materializations":
        if parsed := parse_manifest_key(key):
            mid, cid, gen = parsed
            return ObjectKey(ObjectKind.MANIFEST, key, checkpoint_id=cid, materialization_id=mid, generation=gen)
        table = parse_table_key(key)
        if table is None:
            return None
        return ObjectKey(ObjectKind.TABLE, key, checkpoint_id=_mid_checkpoint(table[1]),
                         materialization_id=table[1], file=table[2])
    if head == "savepoints":
        if name := parse_savepoint_metadata_key(key):
            return ObjectKey(ObjectKind.SAVEPOINT_METADATA, key, savepoint=name)
        if name := parse_savepoint_manifest_key(key):
            return ObjectKey(ObjectKind.SAVEPOINT_MANIFEST, key, savepoint=name)
        table = parse_table_key(key)
        if table is None:
            return None
        return ObjectKey(ObjectKind.SAVEPOINT_TABLE, key, checkpoint_id=_mid_checkpoint(table[1]),
                         materialization_id=table[1], savepoint=table[0], file=table[2])
    for prefix in (MATERIALIZER_LEASE_PREFIX, WRITER_LEASE_PREFIX):
        if key.startswith(prefix):
            lease = parse_lease_name(key[len(prefix):])
            if lease is None:
                return None
            return ObjectKey(ObjectKind.LEASE, key, generation=lease[1], lease=prefix, lease_object=lease[0],
                             renewal=lease[2])
    if key.startswith(INFLIGHT_PREFIX):
        m = _INFLIGHT_RE.match(key)
        if m is None:
            return None
        return ObjectKey(ObjectKind.INFLIGHT, key, checkpoint_id=int(m.group(1)), task=m.group(2),
                         subtask=int(m.group(4)))
    if (seg := parse_history_segment_key(key)) is not None:
        return ObjectKey(ObjectKind.HISTORY, key, segment_no=seg[0], entries=seg[1])
    if (follower := parse_follower_lease_key(key)) is not None:
        return ObjectKey(ObjectKind.FOLLOWER_LEASE, key, file=follower[0], segment=follower[1])
    if m := _STATUS_RE.match(key):
        return ObjectKey(ObjectKind.MATERIALIZER_STATUS, key, file=f"{m.group(1)}-{m.group(2)}")
    if head == "full-snapshots":
        if dump := parse_state_dump_key(key):
            return ObjectKey(ObjectKind.STATE_DUMP, key, checkpoint_id=dump[2], operator_uid=dump[0],
                             subtask=dump[1])
        return ObjectKey(ObjectKind.STATE_DUMP, key) if _BENCH_DUMP_RE.match(key) else None
    return None


def _mid_checkpoint(mid: str) -> int:
    return int(mid.split("-")[1])
