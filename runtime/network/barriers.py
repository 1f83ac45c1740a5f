"""Barrier handling at the input of a task with one or more channels.

* :class:`BarrierAligner` (exactly-once, aligned): when barrier ``n`` arrives on a channel,
  that channel is **blocked** (its later frames stay queued) until barrier ``n`` has arrived
  on every channel; then the task snapshots, forwards the barrier and unblocks all. The
  snapshot therefore reflects exactly the records before barrier ``n`` on every input.
* :class:`BarrierTracker` (at-least-once): no blocking; the task snapshots when barrier
  ``n`` has arrived on every channel. Records after the barrier on fast channels may be in
  the snapshot and are replayed after a restore: duplicates, never loss.

* :class:`BarrierUnaligner` (exactly-once, unaligned): the *first* barrier ``n`` makes the
  task snapshot and forward the barrier at once; nothing blocks. Until barrier ``n`` has
  arrived on every channel, the records arriving on the channels still without it are
  recorded as in-flight data of checkpoint ``n`` (``waiting``); the last barrier completes
  the checkpoint at the task (the in-flight data is written, then the task acknowledges).

All report the time from the first to the last barrier (``alignment_ms``).
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


class BarrierUnaligner(BarrierHandler):
    """Unaligned barriers: :meth:`on_barrier_unaligned` says ``"start"`` at the first barrier
    of a checkpoint and ``"done"`` at the last one (both for a single channel)."""

    def __init__(self, n_channels: int) -> None:
        super().__init__(n_channels)
        self.current: int | None = None
        self.waiting: set[int] = set()  # channels whose barrier ``current`` has not arrived
        self.recording = False  # ``current`` snapshotted: records on ``waiting`` are in flight
        self.started = 0.0

    def on_barrier(self, channel: int, checkpoint_id: int) -> float | None:  # pragma: no cover
        raise TypeError("use on_barrier_unaligned")

    def on_barrier_unaligned(self, channel: int, checkpoint_id: int, finished: bool = False) -> list[str]:
        """The actions for the task, in order: ``"abandon"`` (an older checkpoint still
        recording can no longer complete here), ``"start"``, ``"done"``.

        ``finished``: the channel's input has ended (final watermark). Its barrier blocks it
        (aligned) instead of starting the checkpoint, so a checkpoint whose barriers all come
        after the final watermark (the **final** checkpoint) is taken aligned: every window
        fired before its snapshot, and nothing is left for a next checkpoint to commit.
        A finished channel carries nothing but barriers, so blocking it costs nothing."""
        actions: list[str] = []
        if checkpoint_id <= self.last_done:
            return actions
        if self.current is not None and checkpoint_id < self.current:
            return actions
        if self.current is not None and checkpoint_id > self.current:
            if self.recording:
                actions.append("abandon")  # its checkpoint was aborted, barriers still flowed
            self.current, self.recording = None, False
            self.blocked.clear()
        if self.current is None:
            self.current, self.started = checkpoint_id, time.monotonic()
            self.waiting = set(range(self.n))
            self.recording = False
        self.waiting.discard(channel)
        if not self.recording and (not finished or not self.waiting):
            self.recording = True
            self.blocked.clear()
            actions.append("start")
        elif not self.recording:
            self.blocked.add(channel)
        if not self.waiting:
            self.current, self.recording = None, False
            self.last_done = checkpoint_id
            actions.append("done")
        return actions

    def abort(self, checkpoint_id: int) -> bool:
        """Stop recording ``checkpoint_id`` (aborted); True when it was being recorded."""
        self.last_done = max(self.last_done, checkpoint_id)
        if self.current == checkpoint_id:
            was = self.recording
            self.current, self.waiting, self.recording = None, set(), False
            self.blocked.clear()
            return was
        return False

    def alignment_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000
