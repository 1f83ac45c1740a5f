"""The JSON views of checkpoint metadata: what ``checkpoints list|show --json`` print.

Plain dicts made from :class:`CheckpointMetadata` (:func:`checkpoint_summary` per listed
checkpoint, :func:`checkpoint_detail` for one); the tables of :mod:`tools.cli.checkpoints`
are printed from the same dicts, so both show the same facts.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata, OperatorState
from statelog.layout import (
    checkpoint_key,
    parse_manifest_key,
    parse_savepoint_manifest_key,
    savepoint_metadata_key,
)
from statelog.state_info import StateInfo
from tools.cli.output import iso_utc

if TYPE_CHECKING:
    from statelog.types import ValueType

INTERNAL_PREFIX = "__"  # internal states (timers) are not listed among the user states


def type_name(value_type: ValueType | None) -> str | None:
    if value_type is None:
        return None
    from statelog.types import PICKLE

    return "pickle" if value_type is PICKLE else str(value_type)


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


def state_json(info: StateInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "kind": info.kind.value,
        "value_type": type_name(info.value_type),
        "user_key_type": type_name(info.user_key_type),
        "ttl_ms": None if info.ttl is None else info.ttl.ttl_ms,
    }


def checkpoint_summary(meta: CheckpointMetadata) -> dict[str, Any]:
    """The ``checkpoints list`` record of one checkpoint."""
    return {
        "id": meta.checkpoint_id,
        "kind": meta.kind,
        "timestamp": iso_utc(meta.timestamp_ms),
        "timestamp_ms": meta.timestamp_ms,
        "job_id": meta.job_id,
        "max_parallelism": meta.max_parallelism,
        "sources": meta.sources,
        "operators": [
            {
                "uid": op.uid,
                "parallelism": op.parallelism,
                "states": sorted(n for n in op.states if not is_internal(n)),
            }
            for _, op in sorted(meta.operators.items())
        ],
        "changelog_bytes": meta.changelog_bytes,
        "segments": len(meta.segment_names()),
        "materialization": materialization_summary(meta.manifest_keys()),
        "stats": meta.stats,
    }


def materialization_summary(keys: set[str]) -> list[dict[str, Any]]:
    """The materializations a checkpoint builds on: manifest key, id and checkpoint id."""
    out = []
    for key in sorted(keys):
        parsed = parse_manifest_key(key)
        if parsed is not None:
            out.append({"manifest": key, "id": parsed[0], "checkpoint_id": parsed[1]})
        elif (name := parse_savepoint_manifest_key(key)) is not None:
            out.append({"manifest": key, "id": f"savepoint {name}", "checkpoint_id": None})
        else:
            out.append({"manifest": key, "id": key, "checkpoint_id": None})
    return out


def _range_json(r: ChangelogRange) -> dict[str, Any]:
    return {
        "stream": r.stream,
        "start": r.start,
        "end": r.end,
        "key_groups": r.key_groups.to_json(),
        "bytes": r.bytes,
        "segments": [asdict(s) for s in r.segments],
    }


def _operator_detail(op: OperatorState) -> dict[str, Any]:
    states = sorted(op.states.values(), key=lambda s: s.name)
    return {
        "uid": op.uid,
        "parallelism": op.parallelism,
        "changelog_bytes": op.changelog_bytes,
        "states": [state_json(s) for s in states if not is_internal(s.name)],
        "internal_states": [s.name for s in states if is_internal(s.name)],
        "subtasks": [
            {
                "subtask": h.subtask,
                "key_groups": h.key_groups.to_json(),
                "materialization": [
                    {"manifest": p.manifest, "key_groups": p.key_groups.to_json()} for p in h.materialization
                ],
                "changelog_ranges": len(h.changelog),
                "segments": len(h.segment_names()),
                "changelog_bytes": h.changelog_bytes,
                "ranges": [_range_json(r) for r in h.changelog],
            }
            for h in op.subtasks
        ],
    }


def checkpoint_detail(meta: CheckpointMetadata) -> dict[str, Any]:
    """Everything ``checkpoints show`` prints about one checkpoint."""
    sizes = {
        s.name: s.size
        for op in meta.operators.values()
        for h in op.subtasks
        for r in h.changelog
        for s in r.segments
    }
    out = checkpoint_summary(meta)
    out["metadata_key"] = (
        savepoint_metadata_key(meta.savepoint) if meta.kind == "savepoint" and meta.savepoint
        else checkpoint_key(meta.checkpoint_id)
    )
    out["segment_bytes"] = sum(sizes.values())
    out["operators"] = [_operator_detail(op) for _, op in sorted(meta.operators.items())]
    return out
