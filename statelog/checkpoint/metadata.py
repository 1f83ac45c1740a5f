"""Checkpoint handles and checkpoint metadata (format ``statelog.checkpoint`` v2).

A :class:`SubtaskStateHandle` says how to rebuild one subtask's keyed state: the
materializations it builds on (parts of manifests, each restricted to a key-group range)
plus the changelog ranges after them, each range restricted to a key-group range. :class:`CheckpointMetadata` combines the handles of all
stateful subtasks with the source positions; it is published as one JSON object, written
last, in the checksummed JSON envelope of :mod:`statelog.envelope` that every read verifies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from statelog import envelope
from statelog.changelog.segment_ref import SegmentRef
from statelog.errors import CorruptionError, SerializationError
from statelog.keys.groups import KeyGroupRange
from statelog.state_info import StateInfo

CHECKPOINT_FORMAT = "statelog.checkpoint"
CHECKPOINT_VERSION = 2
# v1: written before materializations existed (no base); v3: v2 whose `sources` hold tagged
# pairs (dicts with non-str keys, see encode_sources), written only when sources need them
READABLE_VERSIONS = (1, 2, 3)
SOURCES_PAIRS_VERSION = 3
PAIRS_TAG = "$pairs"


def encode_sources(sources: Any) -> tuple[Any, bool]:
    """The JSON form of checkpoint ``sources`` and whether it needs tagged pairs (version 3).

    JSON objects only have str keys, so a dict with any other key (int, float, bool, None),
    or whose only key is the tag itself, is written as ``{"$pairs": [[key, value], ...]}``
    in its iteration order; everything else is plain JSON (tuples become lists). A value
    that is not JSON raises :class:`SerializationError` naming the entry.
    """
    tagged = False

    def enc(value: Any, where: str) -> Any:
        nonlocal tagged
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value
        elif isinstance(value, list | tuple):
            return [enc(v, f"{where}[{i}]") for i, v in enumerate(value)]
        elif isinstance(value, dict):
            if all(isinstance(k, str) for k in value) and list(value) != [PAIRS_TAG]:
                return {k: enc(v, f"{where}[{k!r}]") for k, v in value.items()}
            for k in value:
                if not (k is None or isinstance(k, bool | int | str) or (isinstance(k, float) and math.isfinite(k))):
                    raise SerializationError(
                        f"checkpoint sources entry {where} has the key {k!r} of type {type(k).__name__}; "
                        "source positions must be JSON (keys str, int, float, bool or None): convert it"
                    )
            tagged = True
            return {PAIRS_TAG: [[k, enc(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        raise SerializationError(
            f"checkpoint sources entry {where} is {value!r} of type {type(value).__name__}, expected JSON "
            "(dict, list, str, int, finite float, bool or None): convert the source position to JSON"
        )

    return enc(sources, "sources"), tagged


def decode_sources(obj: Any) -> Any:
    """The inverse of :func:`encode_sources` (for version 3 metadata)."""
    if isinstance(obj, list):
        return [decode_sources(v) for v in obj]
    if isinstance(obj, dict):
        if list(obj) == [PAIRS_TAG]:
            return {_pair_key(pair): decode_sources(pair[1]) for pair in obj[PAIRS_TAG]}
        return {k: decode_sources(v) for k, v in obj.items()}
    return obj


def _pair_key(pair: Any) -> Any:
    if not isinstance(pair, list) or len(pair) != 2 or isinstance(pair[0], dict | list):
        raise TypeError(f"a tagged pair of sources is [key, value] with a scalar key, got {pair!r}")
    return pair[0]


@dataclass(frozen=True)
class MaterializedPart:
    """The key groups ``key_groups`` of a materialization (manifest object key) as a base.

    ``bytes`` and ``crc32`` are the size and CRC-32 of the manifest object as the writer of
    the reference knew it: a reader refuses a manifest whose bytes differ (a valid manifest
    copied over another one). ``None`` in references written before they were recorded.
    """

    manifest: str
    key_groups: KeyGroupRange
    bytes: int | None = None
    crc32: int | None = None

    def restrict(self, kgr: KeyGroupRange) -> MaterializedPart | None:
        inter = self.key_groups.intersect(kgr)
        return None if inter.is_empty else MaterializedPart(self.manifest, inter, self.bytes, self.crc32)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"manifest": self.manifest, "key_groups": self.key_groups.to_json()}
        if self.bytes is not None and self.crc32 is not None:
            out["bytes"], out["crc32"] = self.bytes, self.crc32
        return out

    @staticmethod
    def from_json(obj: Any) -> MaterializedPart:
        size, crc = obj.get("bytes"), obj.get("crc32")
        return MaterializedPart(
            str(obj["manifest"]),
            KeyGroupRange.from_json(obj["key_groups"]),
            None if size is None else int(size),
            None if crc is None else int(crc),
        )


@dataclass(frozen=True)
class ChangelogRange:
    """Records ``[start, end)`` of one stream, restricted to ``key_groups``."""

    stream: str
    start: int
    end: int
    key_groups: KeyGroupRange
    segments: tuple[SegmentRef, ...]

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    def restrict(self, kgr: KeyGroupRange) -> ChangelogRange | None:
        inter = self.key_groups.intersect(kgr)
        if inter.is_empty:
            return None
        return ChangelogRange(self.stream, self.start, self.end, inter, self.segments)

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "start": self.start,
            "end": self.end,
            "key_groups": self.key_groups.to_json(),
            "segments": [s.to_json() for s in self.segments],
        }

    @staticmethod
    def from_json(obj: Any) -> ChangelogRange:
        return ChangelogRange(
            stream=str(obj["stream"]),
            start=int(obj["start"]),
            end=int(obj["end"]),
            key_groups=KeyGroupRange.from_json(obj["key_groups"]),
            segments=tuple(SegmentRef.from_json(s) for s in obj["segments"]),
        )


@dataclass(frozen=True)
class SubtaskStateHandle:
    """The keyed state of one subtask at one checkpoint."""

    operator_uid: str
    subtask: int
    parallelism: int
    key_groups: KeyGroupRange
    changelog: tuple[ChangelogRange, ...]
    states: tuple[StateInfo, ...]
    materialization: tuple[MaterializedPart, ...] = ()

    @property
    def changelog_bytes(self) -> int:
        return sum(r.bytes for r in self.changelog)

    def segment_names(self) -> set[str]:
        return {s.name for r in self.changelog for s in r.segments}

    def manifest_keys(self) -> set[str]:
        return {p.manifest for p in self.materialization}

    def to_json(self) -> dict[str, Any]:
        return {
            "operator": self.operator_uid,
            "subtask": self.subtask,
            "parallelism": self.parallelism,
            "key_groups": self.key_groups.to_json(),
            "materialization": [p.to_json() for p in self.materialization],
            "changelog": [r.to_json() for r in self.changelog],
            "states": [s.to_json() for s in self.states],
        }

    @staticmethod
    def from_json(obj: Any) -> SubtaskStateHandle:
        return SubtaskStateHandle(
            operator_uid=str(obj["operator"]),
            subtask=int(obj["subtask"]),
            parallelism=int(obj["parallelism"]),
            key_groups=KeyGroupRange.from_json(obj["key_groups"]),
            changelog=tuple(ChangelogRange.from_json(r) for r in obj["changelog"]),
            states=tuple(StateInfo.from_json(s) for s in obj["states"]),
            materialization=tuple(MaterializedPart.from_json(p) for p in obj.get("materialization") or ()),
        )


@dataclass(frozen=True)
class OperatorState:
    """All subtask handles of one operator uid."""

    uid: str
    parallelism: int
    subtasks: tuple[SubtaskStateHandle, ...]

    @property
    def states(self) -> dict[str, StateInfo]:
        out: dict[str, StateInfo] = {}
        for h in self.subtasks:
            for s in h.states:
                out.setdefault(s.name, s)
        return out

    @property
    def changelog_bytes(self) -> int:
        return sum(h.changelog_bytes for h in self.subtasks)

    def handles_for(self, kgr: KeyGroupRange) -> list[SubtaskStateHandle]:
        return [h for h in self.subtasks if not h.key_groups.intersect(kgr).is_empty]


@dataclass(frozen=True)
class CheckpointMetadata:
    """One completed checkpoint: source positions and the state of every operator."""

    checkpoint_id: int
    job_id: str
    timestamp_ms: int
    max_parallelism: int
    sources: dict[str, Any]
    operators: dict[str, OperatorState]
    stats: dict[str, Any] = field(default_factory=dict)
    kind: str = "checkpoint"  # or "savepoint"
    writer_generation: int | None = None  # the publisher's writer lease generation (fencing)
    savepoint: str | None = None  # a savepoint's name (its identity: checked against the key)

    @property
    def changelog_bytes(self) -> int:
        return sum(op.changelog_bytes for op in self.operators.values())

    def segment_names(self) -> set[str]:
        return {n for op in self.operators.values() for h in op.subtasks for n in h.segment_names()}

    def manifest_keys(self) -> set[str]:
        """Object keys of every materialization manifest this checkpoint builds on."""
        return {k for op in self.operators.values() for h in op.subtasks for k in h.manifest_keys()}

    def body(self) -> dict[str, Any]:
        sources, tagged = encode_sources(self.sources)
        return {
            "format": CHECKPOINT_FORMAT,
            "version": SOURCES_PAIRS_VERSION if tagged else CHECKPOINT_VERSION,
            "kind": self.kind,
            **({"writer_generation": self.writer_generation} if self.writer_generation is not None else {}),
            **({"savepoint": self.savepoint} if self.savepoint is not None else {}),
            "checkpoint_id": self.checkpoint_id,
            "job_id": self.job_id,
            "timestamp_ms": self.timestamp_ms,
            "max_parallelism": self.max_parallelism,
            "sources": sources,
            "stats": self.stats,
            "operators": {
                uid: {
                    "parallelism": op.parallelism,
                    "subtasks": [h.to_json() for h in op.subtasks],
                }
                for uid, op in sorted(self.operators.items())
            },
        }

    def to_bytes(self) -> bytes:
        return envelope.dump(self.body())

    @staticmethod
    def from_bytes(data: bytes, object_key: str) -> CheckpointMetadata:
        body = envelope.load(
            data, object_key, "checkpoint metadata", fmt=CHECKPOINT_FORMAT, versions=READABLE_VERSIONS
        )
        try:
            operators = {
                uid: OperatorState(
                    uid=uid,
                    parallelism=int(op["parallelism"]),
                    subtasks=tuple(SubtaskStateHandle.from_json(h) for h in op["subtasks"]),
                )
                for uid, op in body["operators"].items()
            }
            return CheckpointMetadata(
                checkpoint_id=int(body["checkpoint_id"]),
                job_id=str(body["job_id"]),
                timestamp_ms=int(body["timestamp_ms"]),
                max_parallelism=int(body["max_parallelism"]),
                sources=decode_sources(body["sources"]) if body["version"] >= SOURCES_PAIRS_VERSION else body["sources"],
                operators=operators,
                stats=body.get("stats", {}),
                kind=body.get("kind", "checkpoint"),
                writer_generation=(
                    None if body.get("writer_generation") is None else int(body["writer_generation"])
                ),
                savepoint=None if body.get("savepoint") is None else str(body["savepoint"]),
            )
        except CorruptionError as e:
            if e.key is not None:
                raise
            raise CorruptionError(f"checkpoint metadata {object_key} is malformed: {e}", key=object_key) from None
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise CorruptionError(f"checkpoint metadata {object_key} is malformed: {e}", key=object_key) from None
