"""The checkpoint coordinator (in the job master's process).

It triggers checkpoint ``n`` every ``checkpoint_interval_s`` (at most one in flight): the
workers inject barrier ``n`` at their source tasks, which record their split positions.
Every task acknowledges once it has passed the barrier and its asynchronous part finished,
with its statelog :class:`~statelog.checkpoint.metadata.SubtaskStateHandle` (stateful tasks) and
split positions (source tasks). When all tasks acknowledged, the coordinator publishes the
checkpoint with ``StateJob.publish_checkpoint(n, handles, sources, stats)`` -- the metadata
object is written last, so the checkpoint exists exactly when everything it references is
durable -- and then notifies the workers (backends record the checkpoint in their lineage;
sinks commit). A decline, or no completion within ``checkpoint_timeout_s``, aborts the
checkpoint (workers cancel their pending snapshots); more than
``tolerable_failed_checkpoints`` failures in a row fail the job (which then restarts under
its restart strategy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.config import CHANGELOG
from runtime.errors import CheckpointFailureLimitError
from runtime.network.inflight import too_large
from statelog.checkpoint.metadata import CheckpointMetadata, SubtaskStateHandle
from statelog.errors import FencedError, StatelogError
from statelog.job import StateJob

log = logging.getLogger(__name__)


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    started: float
    final: bool
    waiting: set[str]
    handles: list[SubtaskStateHandle] = field(default_factory=list)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    task_stats: list[dict[str, Any]] = field(default_factory=list)


def referenced_segments(
    source: CheckpointMetadata | list[SubtaskStateHandle] | None,
) -> dict[str, int]:
    """``{segment name: size}`` of every changelog segment the handles reference."""
    if source is None:
        return {}
    handles = source if isinstance(source, list) else [h for op in source.operators.values() for h in op.subtasks]
    return {s.name: s.size for h in handles for r in h.changelog for s in r.segments}


class CheckpointCoordinator:
    def __init__(
        self,
        job: StateJob,
        tasks: set[str],
        *,
        interval_s: float | None,
        timeout_s: float,
        tolerable_failures: int,
        first_id: int,
        broadcast: Callable[[tuple[Any, ...]], None],
        on_complete: Callable[[CheckpointMetadata], None],
        attempt: int,
        mode: str,
        state_backend: str = CHANGELOG,
        previous: CheckpointMetadata | None = None,
        max_inflight_bytes: int | None = None,
    ) -> None:
        self.job = job
        self.tasks = tasks
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.tolerable = tolerable_failures
        self.next_id = first_id
        self.broadcast = broadcast
        self.on_complete = on_complete
        self.attempt = attempt
        self.mode = mode
        self.state_backend = state_backend
        self.max_inflight_bytes = max_inflight_bytes  # per checkpoint, all tasks together
        # not published: a snapshot strategy has nothing restorable
        self.publish = state_backend == CHANGELOG
        self.pending: PendingCheckpoint | None = None
        self.failed_in_row = 0
        self.failed_total = 0
        self.want_final = False
        # asked (while none is pending) before the final checkpoint is triggered; until it says
        # yes, checkpoints go on as usual (runtime/cluster/final_materialization.py)
        self.final_gate: Callable[[], bool] | None = None
        self.suspended = False  # no new checkpoints (stop with savepoint)
        self.final_completed: int | None = None
        now = time.monotonic()
        self.next_trigger = now + interval_s if interval_s else float("inf")
        self._last_records = 0
        self._last_time = now
        self._bytes: dict[int, int] = {}
        # changelog segments the previous checkpoint (or the restored one) references: what a
        # checkpoint references beyond them is what it uploaded (``incremental_bytes``)
        self._segments: dict[str, int] = referenced_segments(previous)

    # -- triggering ----------------------------------------------------------------------------

    def request_final(self) -> None:
        """All sources finished: the next checkpoint (triggered after now) ends the job."""
        self.want_final = True

    def tick(self, now: float) -> None:
        p = self.pending
        if p is not None and now - p.started > self.timeout_s:
            self._fail(p, self._timed_out(p))
        if self.pending is None and not self.suspended:
            due = self.next_trigger
            final = self.want_final and (self.final_gate is None or self.final_gate())
            if final or now >= self.next_trigger or self.next_trigger < due:  # the gate may ask for one
                self._trigger(now, final=final)

    def trigger_soon(self) -> None:
        """Trigger the next checkpoint as soon as none is in flight (e.g. for a savepoint)."""
        self.next_trigger = time.monotonic()

    def next_wakeup(self, now: float) -> float:
        t = self.next_trigger
        if self.pending is not None:
            t = min(t, self.pending.started + self.timeout_s)
        if self.want_final and self.pending is None:
            t = now if self.final_gate is None else min(t, now + 0.05)
        return max(0.0, t - now)

    def _trigger(self, now: float, final: bool) -> None:
        cid = self.next_id
        self.next_id += 1
        self.pending = PendingCheckpoint(cid, now, final, set(self.tasks))
        if final:
            self.want_final = False
        if self.interval_s:
            self.next_trigger = now + self.interval_s
        log.debug("triggering checkpoint %d%s", cid, " (final)" if final else "")
        self.broadcast(("trigger", cid))

    # -- acknowledgements ----------------------------------------------------------------------

    def ack(
        self,
        cid: int,
        task: str,
        handles: list[SubtaskStateHandle],
        sources: dict[str, dict[str, Any]] | None,
        stats: dict[str, Any],
    ) -> None:
        p = self.pending
        if p is None or p.checkpoint_id != cid or task not in p.waiting:
            log.debug("late or unknown acknowledgement of checkpoint %d from task %s", cid, task)
            return
        p.waiting.discard(task)
        p.handles.extend(handles)
        for uid, positions in (sources or {}).items():
            p.sources.setdefault(uid, {}).update(positions)
        p.task_stats.append(stats)
        cap = self.max_inflight_bytes
        if cap is not None:
            size = sum(s.get("inflight_bytes", 0) for s in p.task_stats)
            if size > cap:
                self._fail(p, too_large(size, cap, f"from {len(p.task_stats)} task(s)"))
                return
        if not p.waiting:
            if time.monotonic() - p.started > self.timeout_s:  # expired before the tick that fails it ran
                self._fail(p, self._timed_out(p))
                return
            self._complete(p)

    def _timed_out(self, p: PendingCheckpoint) -> str:
        return f"not completed within {self.timeout_s}s (waiting for tasks {sorted(p.waiting)})"

    def decline(self, cid: int, task: str, reason: str) -> None:
        p = self.pending
        if p is None or p.checkpoint_id != cid:
            return
        self._fail(p, f"declined by task {task}: {reason}")

    def _fail(self, p: PendingCheckpoint, reason: str) -> None:
        self.pending = None
        self.failed_in_row += 1
        self.failed_total += 1
        log.warning("checkpoint %d failed: %s", p.checkpoint_id, reason)
        if self.publish and self.job is not None:  # the root's history: failed ones too (never raises)
            self.job.checkpoint_history.record_failure(
                p.checkpoint_id, reason, attempt=self.attempt,
                duration_ms=round((time.monotonic() - p.started) * 1000, 3),
            )  # fmt: skip
        self.broadcast(("abort", p.checkpoint_id))
        if p.final:
            self.want_final = True  # try the final checkpoint again
        if self.failed_in_row > self.tolerable:
            raise CheckpointFailureLimitError(
                f"{self.failed_in_row} checkpoints failed in a row, more than tolerable_failed_checkpoints="
                f"{self.tolerable}; the last one ({p.checkpoint_id}) {reason}"
            )

    def _complete(self, p: PendingCheckpoint) -> None:
        now = time.monotonic()
        ts = p.task_stats
        records = sum(s.get("records", 0) for s in ts)
        segments = referenced_segments(p.handles) if self.publish else {}
        if self.publish:  # the new changelog this checkpoint references
            uploaded = sum(size for name, size in segments.items() if name not in self._segments)
        else:  # a snapshot strategy references nothing: what its workers wrote
            uploaded = 0
            for s in ts:
                w = s.get("worker")
                b = s.get("bytes_uploaded", 0)
                if w is not None and b > self._bytes.get(w, 0):
                    uploaded += b - self._bytes.get(w, 0)
                    self._bytes[w] = b
        elapsed = max(1e-9, now - self._last_time)
        stats = {
            "duration_ms": round((now - p.started) * 1000, 3),
            "sync_ms": round(max((s.get("sync_ms", 0.0) for s in ts), default=0.0), 3),
            "async_ms": round(max((s.get("async_ms", 0.0) for s in ts), default=0.0), 3),
            "alignment_ms": round(max((s.get("alignment_ms", 0.0) for s in ts), default=0.0), 3),
            "incremental_bytes": uploaded,
            "inflight_bytes": sum(s.get("inflight_bytes", 0) for s in ts),
            "source_records": records,
            "records_per_s": round((records - self._last_records) / elapsed, 1),
            "attempt": self.attempt,
            "mode": self.mode,
            "final": p.final,
        }
        try:
            if self.publish:
                meta = self.job.publish_checkpoint(p.checkpoint_id, p.handles, p.sources, stats)
            else:
                stats["state_backend"] = self.state_backend  # the snapshot strategy's name
                meta = CheckpointMetadata(
                    p.checkpoint_id, self.job.job_id, int(time.time() * 1000), self.job.max_parallelism,
                    dict(p.sources), {}, stats,
                )
        except FencedError:
            raise  # this process lost the root: the job ends, no later checkpoint may follow
        except StatelogError as e:  # e.g. the store failed: this checkpoint failed, not the job
            try:  # an ambiguous failure may have written the metadata: then it exists
                meta = self.job.load_checkpoint(p.checkpoint_id)
            except StatelogError:
                self._fail(p, f"could not be published: {type(e).__name__}: {e}")
                return
        self._last_records, self._last_time = records, now
        self._segments = segments
        self.pending = None
        self.failed_in_row = 0
        log.info("checkpoint %d completed in %.1f ms", p.checkpoint_id, stats["duration_ms"])
        # the checkpoint exists from the publish on: record it before notifying, which may fail
        # (a dead worker) after some sinks already committed -- the restart must restore it
        self.on_complete(meta)
        if p.final:
            self.final_completed = p.checkpoint_id
        self.broadcast(("complete", p.checkpoint_id))
