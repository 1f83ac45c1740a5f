"""Planning a restore job: one task per kept operator and new subtask, before Spark starts.

Each :class:`RestoreTask` carries the merged handle of what the new subtask's key groups
read from the checkpoint (the old handles' materialized parts and changelog ranges,
restricted to those key groups), so a task needs nothing but its own arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statelog.checkpoint.metadata import (
    CheckpointMetadata,
    MaterializedPart,
    OperatorState,
    SubtaskStateHandle,
)
from statelog.descriptors import StateInfo
from statelog.errors import ConfigError
from statelog.keys.groups import KeyGroupRange, key_group_range_for_subtask
from statelog.readers import options as opt


@dataclass(frozen=True)
class RestoreTask:
    """Restore key groups of new subtask ``subtask`` of ``parallelism`` of operator ``uid``."""

    number: int
    uid: str  # in the source checkpoint
    new_uid: str
    subtask: int
    parallelism: int
    handle: dict[str, Any]  # SubtaskStateHandle JSON (old uid, the new subtask's key groups)
    checkpoint_id: int
    job_id: str
    max_parallelism: int


def merged_handle(op: OperatorState, kgr: KeyGroupRange, subtask: int, parallelism: int) -> SubtaskStateHandle:
    """One handle with everything a restore of ``kgr`` reads from ``op``'s handles.

    The old handles have disjoint key groups, so their parts and ranges restricted to
    ``kgr`` can be listed one handle after another (each key group's records stay in order).
    """
    parts: list[MaterializedPart] = []
    ranges = []
    states: dict[str, StateInfo] = {}
    for h in sorted(op.handles_for(kgr), key=lambda h: h.key_groups.start):
        inter = h.key_groups.intersect(kgr)
        for info in h.states:
            states.setdefault(info.name, info)
        for p in h.materialization:
            sub = p.restrict(inter)
            if sub is not None:
                parts.append(sub)
        for r in h.changelog:
            sub_r = r.restrict(inter)
            if sub_r is not None:
                ranges.append(sub_r)
    for info in op.states.values():
        states.setdefault(info.name, info)
    return SubtaskStateHandle(
        operator_uid=op.uid, subtask=subtask, parallelism=parallelism, key_groups=kgr,
        changelog=tuple(ranges), states=tuple(states.values()), materialization=tuple(parts),
    )


def parse_renames(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            raise ConfigError(f"--rename-operator {item!r} is not of the form OLD=NEW")
        if old in out:
            raise ConfigError(f"--rename-operator renames {old!r} twice")
        out[old] = new
    return out


def plan_restore(
    meta: CheckpointMetadata,
    parallelism: int | None,
    drop: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
    where: str = "",
) -> list[RestoreTask]:
    maxp = meta.max_parallelism
    where = where or opt.describe(meta)
    rename = dict(rename or {})
    if parallelism is not None and (type(parallelism) is not int or not 1 <= parallelism <= maxp):
        raise ConfigError(
            f"parallelism {parallelism!r} is outside 1..{maxp}: a job can run at most max_parallelism "
            f"({maxp}) subtasks, one per key group (max_parallelism is fixed for the life of the job)"
        )
    for uid in [*drop, *rename]:
        opt.operator_of(meta, uid, where)
    both = set(drop) & set(rename)
    if both:
        raise ConfigError(f"operator(s) {sorted(both)} are both dropped and renamed; do one or the other")
    kept = [uid for uid in sorted(meta.operators) if uid not in set(drop)]
    if not kept:
        raise ConfigError(f"every operator of {where} would be dropped: nothing to restore")
    new_uids = [rename.get(uid, uid) for uid in kept]
    for uid in new_uids:
        if not isinstance(uid, str) or not uid.strip():
            raise ConfigError("an operator uid must be a non-empty string")
    dup = sorted({u for u in new_uids if new_uids.count(u) > 1})
    if dup:
        raise ConfigError(f"after renaming, operator uid(s) {dup} would be used twice; pick unique uids")
    tasks = []
    for uid in kept:
        op = meta.operators[uid]
        p = parallelism if parallelism is not None else op.parallelism
        for i in range(p):
            kgr = key_group_range_for_subtask(maxp, p, i)
            h = merged_handle(op, kgr, i, p)
            tasks.append(RestoreTask(len(tasks), uid, rename.get(uid, uid), i, p, h.to_json(),
                                     meta.checkpoint_id, meta.job_id, maxp))
    return tasks
