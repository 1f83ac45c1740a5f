"""What ``statelog ui`` shows, gathered from a job root as plain data (``docs/cli.md``, *ui*).

Everything here is read from what the root already records, nothing is estimated:

* **checkpoint history** from the checkpoint metadata (``docs/format.md`` section 5): the
  publish time, the ``stats`` the publisher recorded (``duration_ms``, ``sync_ms``,
  ``async_ms``, ``alignment_ms``, ``incremental_bytes``, ...; which ones depends on the
  publisher: ``StateJob.checkpoint`` records the sync and async parts, the runtime also the
  end-to-end duration and the alignment, ``docs/runtime.md``), and the sizes its handles
  reference: **changelog bytes** (the blocks of its changelog ranges, each stream's block in
  a segment counted once) and **materialized bytes** (the state-table files of the
  manifests it builds on that overlap its materialized parts' key groups, each file once);
* **materializations** from their manifests (section 8): checkpoint, publish time, size,
  the build ``stats``; the **base age** of a checkpoint is how far the materialization it
  builds on (its base) is behind it (in checkpoints, and in time when the base checkpoint is
  still retained; the daemon's *materialization lag* is another figure, :mod:`tools.dashboard.live`);
* **state size per operator** and **key-group skew** from the latest checkpoint: the table
  files of its base that it reaches (rows and bytes per state, as of the base checkpoint) plus
  its changelog tail per operator (the changes since, not counted in those rows); the rows
  per key group come from the ``key_group`` column of those files (read and verified like a
  restore reads them) when they hold at most ``skew_scan_bytes`` together, else from the
  files' row counts spread over their key-group ranges (the page says which);
* **savepoints** from their metadata (``materializer.savepoint.list_savepoints``).

* the **checkpoint history**, the **live figures** and the **materializer daemon's state**
  from :mod:`tools.dashboard.live`.

What a root does not record (durations a publisher did not measure, a root written before
the checkpoint history existed) is listed in ``notes`` instead of invented.
:func:`gather` returns JSON-ready dicts and lists; :mod:`tools.dashboard.page` draws them.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc

from materializer.savepoint import list_savepoints
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import CheckpointNotFoundError, CorruptionError, StoreError
from statelog.materialization.manifest import Manifest, TableFile, list_manifests, load_manifest
from statelog.materialization.table_reader import read_table_file
from tools.dashboard.live import live_figures, materializer_state, timeline
from tools.roots import Root, load_metadata

log = logging.getLogger(__name__)

# read the key_group column of the latest state tables for exact skew up to this many bytes
SKEW_SCAN_BYTES = 64 * 1024 * 1024
# checkpoint stats shown as the parts of a checkpoint's duration, in this order
DURATION_PARTS = ("sync_ms", "async_ms", "alignment_ms")
RECORDED_STATS = ("duration_ms", *DURATION_PARTS, "incremental_bytes")


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class _Manifests:
    """Manifests read once per gather (they are immutable); a missing or corrupt one is noted."""

    def __init__(self, root: Root) -> None:
        self.store = root.catalog.store
        self.cache: dict[str, Manifest] = {}
        self.errors: dict[str, str] = {}

    def get(self, key: str) -> Manifest | None:
        if key in self.errors:
            return None
        try:
            return load_manifest(self.store, key, self.cache)
        except (CorruptionError, StoreError) as e:
            self.errors[key] = str(e)
            return None


def _reached_files(meta: CheckpointMetadata, manifests: _Manifests) -> dict[str, tuple[str, str, TableFile]]:
    """The table files a checkpoint's materialized parts reach: path -> (operator, state, file)."""
    out: dict[str, tuple[str, str, TableFile]] = {}
    for uid, op in meta.operators.items():
        for h in op.subtasks:
            for part in h.materialization:
                m = manifests.get(part.manifest)
                mop = m.operators.get(uid) if m is not None else None
                if mop is None:
                    continue
                for state, files in mop.files.items():
                    for f in files:
                        if not f.key_groups.intersect(part.key_groups).is_empty:
                            out.setdefault(f.path, (uid, state, f))
    return out


def _changelog_blocks(meta: CheckpointMetadata) -> dict[str, dict[tuple[str, str], int]]:
    """Per operator: (stream, segment) -> bytes of that stream's block in the segment."""
    out: dict[str, dict[tuple[str, str], int]] = {}
    for uid, op in meta.operators.items():
        blocks = out.setdefault(uid, {})
        for h in op.subtasks:
            for r in h.changelog:
                for s in r.segments:
                    blocks[(r.stream, s.name)] = s.bytes
    return out


def _base_checkpoint(meta: CheckpointMetadata, manifests: _Manifests) -> int | None:
    """The newest checkpoint a checkpoint's materialized parts were built from (``None``: no base)."""
    ids = [m.checkpoint_id for k in meta.manifest_keys() if (m := manifests.get(k)) is not None]
    return max(ids) if ids else None


def checkpoint_row(
    meta: CheckpointMetadata, manifests: _Manifests, timestamps: dict[int, int]
) -> dict[str, Any]:
    """One checkpoint of the history: its recorded stats and the sizes it references."""
    blocks = _changelog_blocks(meta)
    files = _reached_files(meta, manifests)
    changelog = sum(b for per_op in blocks.values() for b in per_op.values())
    materialized = sum(f.bytes for _, _, f in files.values())
    base = _base_checkpoint(meta, manifests)
    stats = meta.stats
    row: dict[str, Any] = {
        "checkpoint_id": meta.checkpoint_id,
        "timestamp_ms": meta.timestamp_ms,
        "time": iso_utc(meta.timestamp_ms),
        **{k: _number(stats.get(k)) for k in RECORDED_STATS},
        "changelog_bytes": changelog,
        "materialized_bytes": materialized,
        "full_bytes": changelog + materialized,
        "materialized_checkpoint": base,
        "base_age_checkpoints": None if base is None else meta.checkpoint_id - base,
        "base_age_ms": (
            meta.timestamp_ms - timestamps[base] if base is not None and base in timestamps else None
        ),
        "operators": sorted(meta.operators),
    }
    for k in ("records_per_s", "attempt", "mode", "final"):
        if k in stats:
            row[k] = stats[k]
    return row


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def materialization_row(m: Manifest, timestamps: dict[int, int]) -> dict[str, Any]:
    published_after = m.created_ms - timestamps[m.checkpoint_id] if m.checkpoint_id in timestamps else None
    return {
        "id": m.mid,
        "manifest": m.key,
        "checkpoint_id": m.checkpoint_id,
        "created_ms": m.created_ms,
        "time": iso_utc(m.created_ms),
        "rows": m.rows,
        "bytes": m.bytes,
        "files": sum(len(fs) for op in m.operators.values() for fs in op.files.values()),
        "bytes_written": _number(m.stats.get("bytes_written")),
        "bytes_reused": _number(m.stats.get("bytes_reused")),
        "duration_ms": _number(m.stats.get("duration_ms")),
        "published_after_ms": published_after,
    }


def operator_sizes(meta: CheckpointMetadata, manifests: _Manifests) -> list[dict[str, Any]]:
    """State size per operator at ``meta``: materialized rows and bytes per state, changelog tail."""
    files = _reached_files(meta, manifests)
    blocks = _changelog_blocks(meta)
    base = _base_checkpoint(meta, manifests)
    out = []
    for uid, op in sorted(meta.operators.items()):
        states: dict[str, dict[str, int]] = {name: {"rows": 0, "bytes": 0} for name in op.states}
        for f_uid, state, f in files.values():
            if f_uid == uid:
                s = states.setdefault(state, {"rows": 0, "bytes": 0})
                s["rows"] += f.rows
                s["bytes"] += f.bytes
        out.append({
            "operator": uid,
            "parallelism": op.parallelism,
            "base_checkpoint": base,
            "states": [{"state": name, **v} for name, v in sorted(states.items())],
            "materialized_rows": sum(v["rows"] for v in states.values()),
            "materialized_bytes": sum(v["bytes"] for v in states.values()),
            "changelog_bytes": sum(blocks.get(uid, {}).values()),
        })  # fmt: skip
    return out


# rows per key group of table files already read: (store URL, file path) -> counts; table files
# are immutable, so the live page (gathering every few seconds) reads each file once
_COUNTS: dict[tuple[str, str], list[tuple[int, int]]] = {}
_COUNTS_MAX = 4096


def _key_group_counts(root: Root, f: TableFile) -> list[tuple[int, int]]:
    key = (root.url, f.path)
    if key not in _COUNTS:
        kg = read_table_file(root.catalog.store, f, f.key_groups).column("key_group")
        if len(_COUNTS) >= _COUNTS_MAX:
            _COUNTS.clear()
        _COUNTS[key] = [(int(e["values"]), int(e["counts"])) for e in pc.value_counts(kg).to_pylist()]
    return _COUNTS[key]


def key_group_skew(
    root: Root, meta: CheckpointMetadata, manifests: _Manifests, scan_bytes: int = SKEW_SCAN_BYTES
) -> dict[str, Any]:
    """Rows per key group and (operator, state) in the table files ``meta`` reaches."""
    files = _reached_files(meta, manifests)
    m = meta.max_parallelism
    total = sum(f.bytes for _, _, f in files.values())
    exact = total <= scan_bytes
    rows: dict[tuple[str, str], list[float]] = {}
    for _, (uid, state, f) in sorted(files.items()):
        counts = rows.setdefault((uid, state), [0] * m)
        if exact:
            for group, n in _key_group_counts(root, f):
                counts[group] += n
        else:
            share = f.rows / len(f.key_groups)
            for g in range(f.key_groups.start, f.key_groups.end + 1):
                counts[g] += share
    series = [
        {"operator": uid, "state": state, "rows": [round(c, 3) if isinstance(c, float) else c for c in cs]}
        for (uid, state), cs in sorted(rows.items())
    ]
    return {
        "checkpoint_id": meta.checkpoint_id,
        "base_checkpoint": _base_checkpoint(meta, manifests),
        "max_parallelism": m,
        "granularity": "key group" if exact else "table file",
        "table_bytes": total,
        "series": series,
    }


def _summary(values: Iterable[float | int | None]) -> dict[str, Any] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"min": min(present), "avg": round(statistics.fmean(present), 3), "max": max(present)}


def _ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"`` (ids ascending)."""
    spans: list[list[int]] = []
    for cid in ids:
        if spans and cid == spans[-1][1] + 1:
            spans[-1][1] = cid
        else:
            spans.append([cid, cid])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def gather(root: Root, *, skew_scan_bytes: int = SKEW_SCAN_BYTES, now_ms: int | None = None) -> dict[str, Any]:
    """Everything the dashboard shows about the job at ``root``, as JSON-ready data."""
    info = root.require_job()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    store = root.catalog.store
    manifests = _Manifests(root)
    notes: list[str] = []
    metas: list[CheckpointMetadata] = []
    unreadable: list[dict[str, Any]] = []
    for cid in root.catalog.checkpoint_ids():
        try:
            metas.append(load_metadata(root, cid))
        except CheckpointNotFoundError:
            log.info("checkpoint %d was removed by retention while reading", cid)
        except (CorruptionError, StoreError) as e:
            unreadable.append({"checkpoint_id": cid, "error": str(e)})
    timestamps = {m.checkpoint_id: m.timestamp_ms for m in metas}
    history = [checkpoint_row(m, manifests, timestamps) for m in metas]

    materializations = []
    for key, *_ in list_manifests(store):
        m = manifests.get(key)
        if m is not None:
            materializations.append(materialization_row(m, timestamps))

    latest = metas[-1] if metas else None
    operators = operator_sizes(latest, manifests) if latest is not None else []
    skew = key_group_skew(root, latest, manifests, skew_scan_bytes) if latest is not None else None
    savepoints = list_savepoints(store)

    if not metas:
        notes.append("the root has no retained checkpoint yet: the checkpoint charts are empty")
    for stat in RECORDED_STATS:
        missing = [r["checkpoint_id"] for r in history if r[stat] is None]
        if missing and len(missing) < len(history):
            notes.append(f"{stat} is not recorded in the metadata of checkpoints {_ranges(missing)}")
        elif missing:
            notes.append(f"{stat} is not recorded in the metadata of any retained checkpoint")
    if any(r["alignment_ms"] is None for r in history):
        notes.append(
            "alignment is measured by the runtime's barrier alignment only; checkpoints taken with "
            "StateJob.checkpoint (statelog.open) have no barriers and record no alignment_ms"
        )
    line = timeline(store, notes)
    if not line["completed"] and metas:
        notes.append(
            "the root has no checkpoint history (history/checkpoints/, written by this version's "
            "publishers): the timeline charts show the retained checkpoints only"
        )
    if skew is not None and not skew["series"]:
        notes.append(
            f"key-group skew needs a materialization: checkpoint {latest.checkpoint_id if latest else '?'} "
            "builds on none, and the changelog records no per-key-group counts (run "
            "`statelog materializer run ROOT`)"
        )
    elif skew is not None and skew["granularity"] == "table file":
        notes.append(
            f"key-group skew: the state tables hold {skew['table_bytes']} bytes, more than the "
            f"{skew_scan_bytes} bytes read for exact counts, so each table file's rows are spread "
            "evenly over its key-group range"
        )
    if skew is not None and skew["series"]:
        notes.append(
            "key-group skew counts the rows of the materialized state tables; changes in the "
            "changelog tail after the materialization are not counted"
        )
    for key, error in sorted(manifests.errors.items()):
        notes.append(f"manifest {key} could not be read: {error}")
    for row in unreadable:
        notes.append(f"checkpoint {row['checkpoint_id']} could not be read: {row['error']}")

    durations = [
        r["duration_ms"] if r["duration_ms"] is not None else _sum_parts(r) for r in history
    ]
    return {
        "root": root.url,
        "generated_ms": now_ms,
        "generated": iso_utc(now_ms),
        "job": {
            "job_id": info.job_id,
            "max_parallelism": info.max_parallelism,
            "created_ms": info.created_ms,
            "created": iso_utc(info.created_ms),
        },
        "counts": {
            "checkpoints": len(metas),
            "unreadable_checkpoints": len(unreadable),
            "materializations": len(materializations),
            "savepoints": len(savepoints),
            "latest_checkpoint": latest.checkpoint_id if latest is not None else None,
            "latest_checkpoint_age_ms": now_ms - latest.timestamp_ms if latest is not None else None,
        },
        "summary": {
            "duration_ms": _summary(durations),
            "full_bytes": _summary(r["full_bytes"] for r in history),
            "incremental_bytes": _summary(r["incremental_bytes"] for r in history),
            "base_age_checkpoints": _summary(r["base_age_checkpoints"] for r in history),
        },
        "checkpoints": history,
        "unreadable_checkpoints": unreadable,
        "materializations": materializations,
        "operators": operators,
        "skew": skew,
        "savepoints": savepoints,
        "timeline": line,
        "live": live_figures(line, latest.timestamp_ms if latest is not None else None, now_ms),
        "materializer": materializer_state(
            store,
            (latest.checkpoint_id, latest.timestamp_ms) if latest is not None else None,
            max(((m["checkpoint_id"], m["created_ms"]) for m in materializations), default=None),
            now_ms,
            notes,
        ),
        "notes": notes,
    }


def _sum_parts(row: dict[str, Any]) -> float | None:
    """A checkpoint's duration when the publisher recorded its parts but not the total."""
    parts = [row[k] for k in DURATION_PARTS if row[k] is not None]
    return round(sum(parts), 3) if parts else None
