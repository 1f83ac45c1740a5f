"""A task: one subtask of a job vertex, i.e. a chain of operators driven by one loop.

A **source task** reads batches from its splits (between batches the worker injects
barriers when the coordinator triggers a checkpoint) and emits watermarks as its splits'
event time advances. An **input task** takes frames from its input channels round-robin
(skipping channels blocked by alignment), feeds the records to the head operator (input
index 0 or 1), tracks per-channel watermarks (the task's watermark is their minimum) and
hands barriers to its :class:`~runtime.barriers.BarrierHandler`.

At a checkpoint (source: on trigger; input task: when the handler says so) the task runs
the **synchronous part** on its thread: every operator of the chain snapshots (statelog
``backend.snapshot(cid)`` seals its changelog; a file sink pre-commits), then the barrier
is sent on every output behind the records before it. The **asynchronous part** (waiting
for the changelog to be durable, ``pending.result()``) runs on the worker's snapshot pool,
which then acknowledges to the coordinator.
"""

from __future__ import annotations

import pickle
import time
from typing import TYPE_CHECKING, Any

from runtime.barriers import BarrierAligner, BarrierHandler, BarrierTracker
from runtime.channels import BARRIER, WATERMARK, InputChannel
from runtime.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.operators import ChainedOutput, Output, StreamOperator
from runtime.router import Router
from runtime.sources import SourceSplits

if TYPE_CHECKING:
    from runtime.worker import Worker

FRAMES_PER_STEP = 4


class Task:
    def __init__(
        self,
        worker: Worker,
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
    ) -> None:
        self.worker = worker
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
        self.barriers: BarrierHandler = BarrierAligner(n) if aligned else BarrierTracker(n)
        self.channel_wm = [MIN_WATERMARK] * n
        self.wm = MIN_WATERMARK
        self._rr = 0
        self.head: Output = ChainedOutput(ops[0]) if ops else router
        self.records_in = 0
        self._rate = source.source.records_per_s if source is not None else None
        self._t0 = time.monotonic()
        self._paced = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        for op in reversed(self.ops):  # downstream first, as in Flink
            op.open()

    def close(self) -> None:
        for op in self.ops:
            op.close()
        if self.source is not None:
            self.source.close()

    # -- running -------------------------------------------------------------------------------

    def step(self) -> bool:
        """Do a bounded amount of work; False when there was nothing to do."""
        if not self.router.has_capacity():
            return False
        if self.source is not None:
            return self._source_step()
        progressed = False
        channels, blocked = self.channels, self.barriers.blocked
        n = len(channels)
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
            if not self.router.has_capacity():
                break
        self.router.flush()
        return progressed

    def _source_step(self) -> bool:
        if self.source_done:
            return False
        src = self.source
        assert src is not None
        n = self.worker.batch_size
        if self._rate:
            allowed = int(self._rate * (time.monotonic() - self._t0)) - self._paced
            if allowed <= 0:
                return False
            n = min(n, allowed)
        batch = src.read(n)
        self._paced += len(batch)
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
            self.worker.send(("source_finished", self.key))
            return True
        return bool(batch)

    def _process_frame(self, ci: int, frame: Any) -> None:
        if isinstance(frame, bytes):
            frame = pickle.loads(frame)
        records, event = frame
        if records:
            self.records_in += len(records)
            idx = self.channel_inputs[ci]
            head = self.ops[0]
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

    def checkpoint(self, checkpoint_id: int, alignment_ms: float = 0.0) -> None:
        """The synchronous part of checkpoint ``checkpoint_id`` at this task (at its barrier)."""
        t0 = time.monotonic()
        sources = None
        if self.source is not None:
            sources = {self.source_uid: self.source.positions()}
        pending = []
        committables = {}
        for op in self.ops:
            snap = op.snapshot(checkpoint_id)
            if snap is None:
                continue
            pending.extend(snap.pending)
            if snap.committables is not None:
                committables[op.uid] = snap.committables
        self.router.event((BARRIER, checkpoint_id))
        if committables:
            self.worker.send(("committables", checkpoint_id, self.key, committables))
        stats = {
            "sync_ms": (time.monotonic() - t0) * 1000,
            "alignment_ms": alignment_ms,
            "records": self.source.emitted if self.source is not None else 0,
        }
        self.worker.acknowledge_async(checkpoint_id, self.key, pending, sources, stats)

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        for op in self.ops:
            op.checkpoint_complete(checkpoint_id)
