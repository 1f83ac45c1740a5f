"""Publishing a restore job's savepoint: one manifest, then the savepoint metadata, last.

The tasks' tables become one manifest (kind ``savepoint``) and the savepoint metadata names
one handle per new subtask referencing it; the savepoint exists once the metadata is written.
:class:`RestoreResult` is what the job reports.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from statelog.checkpoint.metadata import CheckpointMetadata, OperatorState, SubtaskStateHandle
from statelog.descriptors import StateInfo
from statelog.job import StateJob
from statelog.keys.groups import key_group_range_for_subtask
from statelog.layout import new_materialization_id, savepoint_manifest_key, savepoint_metadata_key
from statelog.materialization.manifest import Manifest, MaterializedOperator, TableFile
from statelog.spark.rescale.plan import RestoreTask

log = logging.getLogger(__name__)


@dataclass
class RestoreResult:
    savepoint: str
    checkpoint_id: int
    source: str
    max_parallelism: int
    operators: dict[str, dict[str, Any]]
    dropped: list[str]
    rows: int
    files: int
    bytes: int
    seconds: float
    tasks: int
    metadata_key: str
    manifest_key: str
    sources: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "savepoint": self.savepoint,
            "restore": f"savepoint:{self.savepoint}",
            "checkpoint_id": self.checkpoint_id,
            "source": self.source,
            "max_parallelism": self.max_parallelism,
            "operators": self.operators,
            "dropped": self.dropped,
            "rows": self.rows,
            "files": self.files,
            "bytes": self.bytes,
            "tasks": self.tasks,
            "seconds": self.seconds,
            "metadata_key": self.metadata_key,
            "manifest_key": self.manifest_key,
            "sources": self.sources,
        }


def publish_savepoint(job: StateJob, meta: CheckpointMetadata, where: str, name: str, tasks: list[RestoreTask],
             results: list[dict[str, Any]], dropped: list[str], t0: float) -> RestoreResult:
    maxp = meta.max_parallelism
    files: dict[str, dict[str, list[TableFile]]] = {}
    states: dict[str, dict[str, StateInfo]] = {}
    covered: dict[str, dict[str, int]] = {}
    stats = {"rows": 0, "files_written": 0, "bytes_written": 0, "changelog_records": 0, "changelog_bytes": 0,
             "base_rows_read": 0}
    parallelism: dict[str, int] = {}
    source_uid: dict[str, str] = {}
    for task, res in zip(tasks, results, strict=True):
        mop = MaterializedOperator.from_json(task.new_uid, res["operator"])
        parallelism[task.new_uid] = task.parallelism
        source_uid[task.new_uid] = task.uid
        for info in mop.states:
            states.setdefault(task.new_uid, {}).setdefault(info.name, info)
        for s, end in mop.covered.items():
            cov = covered.setdefault(task.new_uid, {})
            cov[s] = max(cov.get(s, 0), end)
        for state, fs in mop.files.items():
            files.setdefault(task.new_uid, {}).setdefault(state, []).extend(fs)
        for k in stats:
            stats[k] += int(res["stats"].get(k, 0))
    operators = {}
    for uid in parallelism:
        operators[uid] = MaterializedOperator(
            uid=uid,
            states=tuple(states.get(uid, {})[n] for n in sorted(states.get(uid, {}))),
            covered=covered.get(uid, {}),
            files={n: tuple(sorted(fs, key=lambda f: f.key_groups.start)) for n, fs in files.get(uid, {}).items()},
        )
    stats["duration_ms"] = round((time.monotonic() - t0) * 1000, 1)
    mkey = savepoint_manifest_key(name)
    manifest = Manifest(
        mid=new_materialization_id(meta.checkpoint_id, 0), key=mkey, checkpoint_id=meta.checkpoint_id,
        job_id=meta.job_id, max_parallelism=maxp, created_ms=int(time.time() * 1000), lease_generation=0,
        operators=operators, kind="savepoint", stats=stats, savepoint=name,
    )
    data, manifest = manifest.stored()
    job.store.put(mkey, data)
    handles = {}
    for uid, p in parallelism.items():
        old = meta.operators[source_uid[uid]]
        infos = tuple(old.states.values())
        handles[uid] = OperatorState(uid, p, tuple(
            SubtaskStateHandle(
                operator_uid=uid, subtask=i, parallelism=p, key_groups=key_group_range_for_subtask(maxp, p, i),
                changelog=(), states=infos,
                materialization=(manifest.reference(key_group_range_for_subtask(maxp, p, i)),),
            )
            for i in range(p)
        ))
    nfiles = sum(len(fs) for op in operators.values() for fs in op.files.values())
    renamed = {uid: source_uid[uid] for uid in parallelism if source_uid[uid] != uid}
    sp = CheckpointMetadata(
        checkpoint_id=meta.checkpoint_id, job_id=meta.job_id, timestamp_ms=int(time.time() * 1000),
        max_parallelism=maxp, sources=dict(meta.sources), operators=handles, kind="savepoint", savepoint=name,
        stats={
            "checkpoint_timestamp_ms": meta.timestamp_ms, "manifest": mkey, "rows": manifest.rows,
            "bytes": manifest.bytes, "files": nfiles, "restored_from": where,
            "parallelism": dict(parallelism), "dropped_operators": dropped, "renamed_operators": renamed,
        },
    )
    job.store.put(savepoint_metadata_key(name), sp.to_bytes())  # the savepoint exists from here
    seconds = round(time.monotonic() - t0, 3)
    log.info("restore job wrote savepoint %r: %d rows in %d files (%d bytes) in %.2fs",
             name, manifest.rows, nfiles, manifest.bytes, seconds)
    return RestoreResult(
        savepoint=name, checkpoint_id=meta.checkpoint_id, source=where, max_parallelism=maxp,
        operators={
            uid: {"from": source_uid[uid], "parallelism": p, "rows": operators[uid].rows,
                  "files": sum(len(fs) for fs in operators[uid].files.values()), "bytes": operators[uid].bytes}
            for uid, p in sorted(parallelism.items())
        },
        dropped=dropped, rows=manifest.rows, files=nfiles, bytes=manifest.bytes, seconds=seconds,
        tasks=len(tasks), metadata_key=savepoint_metadata_key(name), manifest_key=mkey,
        sources=json.loads(json.dumps(meta.sources, default=str)),
    )
