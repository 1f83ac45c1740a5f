"""Barrier handling at the input of a task with one or more channels.

* :class:`BarrierAligner` (exactly-once, aligned): when barrier ``n`` arrives on a channel,
  that channel is **blocked** (its later frames stay queued) until barrier ``n`` has arrived
  on every channel; then the task snapshots, forwards the barrier and unblocks all. The
  snapshot therefore reflects exactly the records before barrier ``n`` on every input.
* :class:`BarrierTracker` (at-least-once): no blocking; the task snapshots when barrier
  ``n`` has arrived on every channel. Records after the barrier on fast channels may be in
  the snapshot and are replayed after a restore: duplicates, never loss.

Both report the time from the first to the last barrier (``alignment_ms``).
"""

from __future__ import annotations

import time


class BarrierHandler:
    def __init__(self, n_channels: int) -> None:
        self.n = n_channels
        self.blocked: set[int] = set()
        self.last_done = 0

    def on_barrier(self, channel: int, checkpoint_id: int) -> float | None:
        """Handle a barrier; returns the alignment time (ms) when the task must snapshot now."""
        raise NotImplementedError


class BarrierAligner(BarrierHandler):
    def __init__(self, n_channels: int) -> None:
        super().__init__(n_channels)
        self.current: int | None = None
        self.arrived: set[int] = set()
        self.started = 0.0

    def on_barrier(self, channel: int, checkpoint_id: int) -> float | None:
        if checkpoint_id <= self.last_done:
            return None  # a barrier of a checkpoint this task has already taken
        if self.current is None or checkpoint_id > self.current:
            # a newer barrier: an older alignment can only be pending if its barrier was lost,
            # which channels do not do; start over defensively
            self.blocked.clear()
            self.current, self.arrived, self.started = checkpoint_id, set(), time.monotonic()
        elif checkpoint_id < self.current:
            return None
        self.arrived.add(channel)
        if len(self.arrived) < self.n:
            self.blocked.add(channel)
            return None
        self.blocked.clear()
        self.current = None
        self.last_done = checkpoint_id
        return (time.monotonic() - self.started) * 1000


class BarrierTracker(BarrierHandler):
    def __init__(self, n_channels: int) -> None:
        super().__init__(n_channels)
        self.counts: dict[int, tuple[int, float]] = {}

    def on_barrier(self, channel: int, checkpoint_id: int) -> float | None:
        if checkpoint_id <= self.last_done:
            return None
        count, started = self.counts.get(checkpoint_id, (0, time.monotonic()))
        count += 1
        if count < self.n:
            self.counts[checkpoint_id] = (count, started)
            return None
        self.counts.pop(checkpoint_id, None)
        for cid in [c for c in self.counts if c < checkpoint_id]:
            del self.counts[cid]  # older checkpoints that can no longer complete here
        self.last_done = checkpoint_id
        return (time.monotonic() - started) * 1000
