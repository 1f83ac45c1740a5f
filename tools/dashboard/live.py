"""The live part of ``statelog ui``: the running job and the materializer daemon, read from the root.

Everything comes from objects the job and the daemon write under the job root, so it works for
every way of running (the runtime, a consumer loop on ``statelog.open()``, a job on another
host) without reaching a port (``docs/cli.md``, *ui*):

* the **checkpoint history** (``history/checkpoints/``, :mod:`statelog.checkpoint.history`):
  every checkpoint's stats, failed ones and restarts, beyond retention;
* the **materializer lease** (its holder and last renewal) and each daemon's **status object**
  (``materializer/status/``, :mod:`materializer.daemon.status`: last cycle, last error).

Two names for two delays (one definition each): **materialization lag** is the daemon's (how
far the newest materialization is behind the newest checkpoint, as its metric
``statelog_materializer_lag_checkpoints``); **base age** is a checkpoint's (how far the
materialization it builds on is behind it, :mod:`tools.dashboard.data`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from materializer.daemon.status import read_statuses
from materializer.lease import current_holder
from statelog.checkpoint.history import COMPLETED, FAILED, RESTART, read_history
from statelog.store.base import ObjectStore

LIVE_INTERVAL_S = 3.0  # seconds between the served page's refreshes, by default

# the entries of the history shown in the timeline charts (newest last)
TIMELINE_ENTRIES = 4096


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def timeline(store: ObjectStore, notes: list[str]) -> dict[str, Any]:
    """The checkpoint history as chart rows: completed, failed and restarts, each with its time."""
    read = read_history(store)
    for error in read.errors[:5]:
        notes.append(f"checkpoint history: {error}")
    if len(read.errors) > 5:
        notes.append(f"checkpoint history: {len(read.errors) - 5} more unreadable entries")
    entries = read.entries[-TIMELINE_ENTRIES:]
    for e in entries:
        e["time"] = iso_utc(int(e.get("timestamp_ms") or e.get("time_ms") or 0))
    return {
        "completed": [e for e in entries if e.get("status") == COMPLETED],
        "failed": [e for e in entries if e.get("status") == FAILED],
        "restarts": [e for e in entries if e.get("status") == RESTART],
        "segments": read.segments,
        "unreadable_entries": len(read.errors),
    }


def materializer_state(
    store: ObjectStore, latest: tuple[int, int] | None, newest_mat: tuple[int, int] | None, now_ms: int,
    notes: list[str],
) -> dict[str, Any]:
    """The leader lease, every daemon's status and the materialization lag (the daemon's definition).

    ``latest``: (id, timestamp ms) of the newest checkpoint; ``newest_mat``: (checkpoint id,
    publish ms) of the newest materialization.
    """
    holder = current_holder(store)
    if holder is not None:
        idle_s = max(0.0, now_ms / 1000 - holder["last_activity_mtime"])
        state = "released" if holder["released"] else "stale" if idle_s > holder["ttl_ms"] / 1000 else "held"
        holder = {k: holder.get(k) for k in ("owner", "host", "pid", "generation", "ttl_ms", "acquired_ms")}
        holder.update(state=state, last_activity_age_s=round(idle_s, 3))
    statuses, errors = read_statuses(store)
    notes.extend(f"materializer status: {e}" for e in errors)
    for s in statuses:
        s["age_s"] = round(max(0, now_ms - int(s.get("time_ms", 0))) / 1000, 3)
    lag_checkpoints = lag_ms = None
    if latest is not None:
        lag_checkpoints = latest[0] - newest_mat[0] if newest_mat is not None else None
        if newest_mat is not None and lag_checkpoints:
            lag_ms = max(0, now_ms - newest_mat[1])
        elif newest_mat is not None:
            lag_ms = 0
    return {
        "lease": holder,
        "daemons": statuses,
        # the daemon's definition: how far the newest materialization is behind the newest checkpoint
        "materialization_lag_checkpoints": lag_checkpoints,
        "materialization_lag_ms": lag_ms,
    }


def live_figures(line: dict[str, Any], latest_ms: int | None, now_ms: int) -> dict[str, Any]:
    """The running job's figures from the newest history entries."""
    done, failed, restarts = line["completed"], line["failed"], line["restarts"]
    last = done[-1] if done else None
    newest_ms = max([latest_ms or 0, *(int(e.get("timestamp_ms", 0)) for e in done[-1:])]) or None
    throughput = None
    if last is not None and "records_per_s" in last:
        throughput = last["records_per_s"]
    elif len(done) >= 2 and "delta_changes" in last and last.get("timestamp_ms") and done[-2].get("timestamp_ms"):
        seconds = (last["timestamp_ms"] - done[-2]["timestamp_ms"]) / 1000
        throughput = round(last["delta_changes"] / seconds, 1) if seconds > 0 else None
    return {
        "latest_checkpoint": None if last is None else last.get("checkpoint_id"),
        "latest_checkpoint_age_ms": None if newest_ms is None else max(0, now_ms - newest_ms),
        "records": None if last is None else last.get("source_records"),
        "records_out": None if last is None else last.get("records_out"),
        "throughput_per_s": throughput,
        "throughput_of": "source records" if last is not None and "records_per_s" in last else "state changes",
        "attempt": None if last is None else last.get("attempt"),
        "restarts": len(restarts),
        "last_restart": restarts[-1] if restarts else None,
        "failed_checkpoints": len(failed),
        "last_failure": failed[-1] if failed else None,
        "watermark_ms": None if last is None else last.get("watermark_ms"),
        "kafka_lag": None if last is None else last.get("kafka_lag"),
        "history_checkpoints": len(done),
    }
