"""A task: one subtask of a job vertex, i.e. a chain of operators driven by one loop.

A **source task** reads batches from its splits (between batches the worker injects
barriers when the coordinator triggers a checkpoint) and emits watermarks as its splits'
event time advances. An **input task** takes frames from its input channels round-robin
(skipping channels blocked by alignment), feeds the records to the head operator (input
index 0 or 1), tracks per-channel watermarks (the task's watermark is their minimum) and
hands barriers to its :class:`~runtime.network.barriers.BarrierHandler`.

At a checkpoint (source: on trigger; input task: when the handler says so) the task runs
the **synchronous part** on its thread: every operator of the chain snapshots (statelog
``backend.snapshot(cid)`` seals its changelog; a file sink pre-commits), then the barrier
is sent on every output behind the records before it. In unaligned mode an input task
snapshots at the *first* barrier, sends it ahead of its buffered output and records the
records the barrier overtook until the last barrier (:mod:`runtime.network.inflight`); a task
restored from such a checkpoint replays them in its first step
(:mod:`runtime.task.unaligned`). The **asynchronous part** (waiting
for the changelog to be durable, ``pending.result()``) runs on the worker's snapshot pool,
which then acknowledges to the coordinator.
"""

from __future__ import annotations

import time
from typing import Any

from runtime.api.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.connectors.sources import SourceSplits
from runtime.network.barriers import (
    BarrierAligner,
    BarrierHandler,
    BarrierTracker,
    BarrierUnaligner,
)
from runtime.network.frames import BARRIER, WATERMARK
from runtime.network.input_channel import InputChannel
from runtime.network.router import Router
from runtime.task.host import TaskHost
from runtime.task.operators import ChainedOutput, KeyedOperator, Output, StreamOperator
from runtime.task.unaligned import UnalignedCheckpointing

FRAMES_PER_STEP = 4  # input frames a task handles per step at most
# ... and it stops after this long: the tasks of a worker share its thread, so a slow operator
# must not starve the others (with them, the back-pressure it causes)
STEP_BUDGET_S = 0.01
# A source task reads one batch per step (Task._source_step): the downstream tasks of its
# worker take up to FRAMES_PER_STEP frames per step, so without back-pressure the channels
# stay short and a barrier waits behind little (bench runtime, 10^6 keys: alignment median
# 55 ms with four batches per step, 15 ms with one, the same throughput); back-pressure
# still builds behind a slow operator, whose steps end after STEP_BUDGET_S.


class Task(UnalignedCheckpointing):
    """One subtask of a job vertex (see the module docstring); its part in unaligned
    checkpoints is :class:`~runtime.task.unaligned.UnalignedCheckpointing`'s."""

    def __init__(
        self,
        host: TaskHost,
        key: str,
        vertex_id: int,
        ops: list[StreamOperator],
        router: Router,
        *,
        channels: list[InputChannel] | None = None,
        channel_inputs: list[int] | None = None,
        source: SourceSplits | None = None,
        source_uid: str | None = None,
        aligned: bool = True,
        unaligned: bool = False,
        channel_edges: list[int] | None = None,
        batch_rows: int | None = None,
    ) -> None:
        self.host = host
        self.key = key
        self.vertex_id = vertex_id
        self.ops = ops
        self.router = router
        self.channels = channels or []
        self.channel_inputs = channel_inputs or []
        self.source = source
        self.source_uid = source_uid
        self.source_done = False
        n = len(self.channels)
        self.unaligned = unaligned and source is None
        # unaligned mode: barriers go out urgent (they overtake what the channels queue)
        self.urgent_barriers = unaligned
        self.barriers: BarrierHandler = (
            BarrierUnaligner(n) if self.unaligned else BarrierAligner(n) if aligned else BarrierTracker(n)
        )
        self.channel_edges = channel_edges or [0] * n
        # unaligned: the checkpoint being recorded (first barrier seen, not yet the last one)
        self._u_pending: list[Any] = []
        self._u_input: list[tuple[int, int, Any, Any]] = []
        self._u_output: list[tuple[int, Any, Any]] = []
        self._u_sync: dict[str, Any] = {}
        # in-flight data of the restored checkpoint, replayed before any new input
        self.replay: tuple[list[Any], list[Any]] | None = None
        self.channel_wm = [MIN_WATERMARK] * n
        self.wm = MIN_WATERMARK
        self._rr = 0
        self.head: Output = ChainedOutput(ops[0]) if ops else router
        self.records_in = 0
        self.backpressured_s = 0.0  # time step() found no room in the output channels
        self._bp_since: float | None = None
        self._rate = source.source.records_per_s if source is not None else None
        self._rows = batch_rows or 0  # rows per read of a source read as record batches (else: records)
        self._read = None if source is None else source.read_batch if batch_rows else source.read
        self._t0 = time.monotonic()
        # a keyed head whose state is on disk: each input frame's keys are read in one batch
        self._prefetch: Any = None

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        for op in reversed(self.ops):  # downstream first, as in Flink
            op.open()
        head = self.ops[0] if self.ops else None
        if isinstance(head, KeyedOperator) and head.backend.on_disk:
            self._prefetch = head.prefetch

    def close(self) -> None:
        for op in self.ops:
            op.close()
        if self.source is not None:
            self.source.close()

    # -- running -------------------------------------------------------------------------------

    def step(self) -> bool:
        """Do a bounded amount of work; False when there was nothing to do."""
        if self.replay is not None:
            # the restored checkpoint's in-flight records come before everything of this run,
            # its first barrier included (one may wait urgently already: its snapshot must
            # include them, or the next checkpoint holds them nowhere)
            self._replay()
            return True
        urgent = False
        if self.unaligned:  # urgent barriers first, even when the outputs are full
            for i, ch in enumerate(self.channels):
                while ch.urgent:
                    self._urgent_barrier(i, ch)
                    urgent = True
        if not self.router.has_capacity():
            if self._bp_since is None:
                self._bp_since = time.monotonic()
            return urgent
        if self._bp_since is not None:
            self.backpressured_s += time.monotonic() - self._bp_since
            self._bp_since = None
        if self.source is not None:
            return self._source_step()
        progressed = False
        channels, blocked = self.channels, self.barriers.blocked
        n = len(channels)
        t0 = time.monotonic()
        for _ in range(FRAMES_PER_STEP):
            for k in range(n):
                i = (self._rr + k) % n
                if i in blocked:
                    continue
                frame = channels[i].poll()
                if frame is not None:
                    self._rr = i + 1
                    self._process_frame(i, frame)
                    progressed = True
                    break
            else:
                break
            if not self.router.has_capacity() or time.monotonic() - t0 >= STEP_BUDGET_S:
                break
        self.router.flush()
        return progressed

    def _source_step(self) -> bool:
        """Read one batch (see the comment at STEP_BUDGET_S: why not more)."""
        if self.source_done:
            return False
        src = self.source
        assert src is not None
        n = self._rows or self.host.batch_size
        if self._rate:
            allowed = int(self._rate * (time.monotonic() - self._t0)) - src.emitted  # records (rows) read
            if allowed <= 0:
                return False
            n = min(n, allowed)
        batch = self._read(n)  # records, or one record batch (from_source(..., batches=True))
        head = self.head
        emit = head.emit
        for value, ts in batch:
            emit(value, ts)
        wm = src.watermark()
        if wm > self.wm:
            self.wm = wm
            head.watermark(wm)
        self.router.flush()
        if src.finished:
            self.source_done = True
            if self.wm < MAX_WATERMARK:  # a source without watermarks ends with the final one
                self.wm = MAX_WATERMARK
                head.watermark(MAX_WATERMARK)
                self.router.flush()
            self.host.send(("source_finished", self.key))
            return True
        return bool(batch)

    def _process_frame(self, ci: int, frame: Any) -> None:
        records, event = frame
        if records:
            self.records_in += len(records)
            if self.unaligned and self.barriers.recording and ci in self.barriers.waiting:  # type: ignore[attr-defined]
                # overtaken by the barrier being recorded: in-flight data of that checkpoint
                edge, idx = self.channel_edges[ci], self.channel_inputs[ci]
                self._u_input.extend((edge, idx, v, t) for v, t in records)
            idx = self.channel_inputs[ci]
            head = self.ops[0]
            if self._prefetch is not None:
                self._prefetch(records, idx)
            if idx == 0:
                emit = self.head.emit
                for value, ts in records:
                    emit(value, ts)
            else:
                process = head.process
                for value, ts in records:
                    process(value, ts, idx)
        if event is not None:
            kind, arg = event
            if kind == WATERMARK:
                self._on_watermark(ci, arg)
            elif kind == BARRIER and self.unaligned:
                self._on_unaligned_barrier(ci, arg)
            elif kind == BARRIER:
                alignment_ms = self.barriers.on_barrier(ci, arg)
                if alignment_ms is not None:
                    self.checkpoint(arg, alignment_ms)

    def _on_watermark(self, ci: int, wm: int) -> None:
        if wm <= self.channel_wm[ci]:
            return
        self.channel_wm[ci] = wm
        new = min(self.channel_wm)
        if new > self.wm:
            self.wm = new
            self.head.watermark(new)

    def on_processing_time(self, now_ms: int) -> None:
        for op in self.ops:
            op.on_processing_time(now_ms)
        self.router.flush()

    # -- checkpoints ---------------------------------------------------------------------------

    def _snapshot_operators(self, checkpoint_id: int) -> tuple[list[Any], dict[str, Any]]:
        """Snapshot every operator of the chain, in chain order: (pending snapshots, committables by uid)."""
        pending: list[Any] = []
        committables: dict[str, Any] = {}
        for op in self.ops:
            snap = op.snapshot(checkpoint_id)
            if snap is None:
                continue
            pending.extend(snap.pending)
            if snap.committables is not None:
                committables[op.uid] = snap.committables
        return pending, committables

    def checkpoint(self, checkpoint_id: int, alignment_ms: float = 0.0) -> None:
        """The synchronous part of checkpoint ``checkpoint_id`` at this task (at its barrier)."""
        t0 = time.monotonic()
        sources = None
        if self.source is not None:
            sources = {self.source_uid: self.source.snapshot_positions(checkpoint_id)}
        pending, committables = self._snapshot_operators(checkpoint_id)
        output: list[tuple[int, Any, Any]] = []
        if self.urgent_barriers and self._may_overtake():
            # a source in unaligned mode: its barrier overtakes the records it still buffers or
            # queues (they are before its positions: stored with the checkpoint as output)
            output = self._overtake_outputs(checkpoint_id, True)
        else:
            self.router.event((BARRIER, checkpoint_id))  # in line, behind the buffered records
        if committables:
            self.host.send(("committables", checkpoint_id, self.key, committables))
        stats = {
            "sync_ms": (time.monotonic() - t0) * 1000,
            "alignment_ms": alignment_ms,
            "records": self.source.emitted if self.source is not None else 0,
            **self.metric_stats(),
        }
        blob = None
        if output:
            ref = self._inflight(checkpoint_id, [], output, pending, stats, held=False)
            if ref is None:
                return  # declined: too large
            blob, inflight_sources = ref
            sources = dict(sources or {}, **inflight_sources)
        self.host.acknowledge_async(checkpoint_id, self.key, pending, sources, stats, blob=blob)

    def metric_stats(self) -> dict[str, Any]:
        """What this task reports with each acknowledgement for the master's metrics: its
        cumulative counters (records in, sources: read; records out: sent downstream; seconds
        back-pressured), its watermark, its keyed backends' size figures and its channels."""
        stats: dict[str, Any] = {
            "records_in": self.source.emitted if self.source is not None else self.records_in,
            "records_out": sum(e.sent_records for e in self.router.edges),
            "backpressured_s": round(self.backpressured_s, 6),
            "state": [(b.operator_uid, b.subtask, b.size_figures()) for op in self.ops
                      if (b := getattr(op, "backend", None)) is not None],  # fmt: skip
            "channels": self.channel_stats(),
        }
        if MIN_WATERMARK < self.wm < MAX_WATERMARK:
            stats["watermark_ms"] = self.wm
        return stats

    def channel_stats(self) -> dict[str, dict[str, float]]:
        """Per channel (``"<edge>.<upstream subtask>-<downstream subtask>"``) what this task
        knows of it: of its input channels the bound and what waits at this end, of its output
        channels what is in them and how long they were full (the job master's metrics)."""
        out: dict[str, dict[str, float]] = {}
        for ch in self.channels:
            frames, records, nbytes = ch.bound()
            out[ch.label] = {"bound_frames": frames, "bound_records": records, "bound_bytes": nbytes,
                             "queued_frames": ch.backlog(), "queued_bytes": ch.queued_bytes}  # fmt: skip
        for edge in self.router.edges:
            for och in edge.channels:
                frames, records = och.buffered()
                out.setdefault(och.label, {}).update(
                    buffered_frames=frames, buffered_records=records, backpressured_s=round(och.backpressured_s, 6)
                )
        return out

    def _replay(self) -> None:
        """Feed the restored in-flight data: first the output, then the input records."""
        assert self.replay is not None
        data_in, data_out = self.replay
        self.replay = None
        edges = self.router.edges
        for k, v, t in data_out:
            edges[k].emit(v, t)
        for _edge, idx, v, t in data_in:
            if idx == 0:
                self.head.emit(v, t)
            else:
                self.ops[0].process(v, t, idx)
        self.records_in += len(data_in)
        self.router.flush()

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.source is not None:
            self.source.checkpoint_complete(checkpoint_id)
        for op in self.ops:
            op.checkpoint_complete(checkpoint_id)
