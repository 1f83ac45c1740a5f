"""Buffer debloating: how much one channel may hold, from what its consumer takes per second.

A :class:`Debloater` sits at the downstream end of a channel (its
:class:`~runtime.network.input_channel.InputChannel`). The task thread reports every frame it takes
(:meth:`Debloater.consumed`: records and, for remote frames, bytes) and the channel
reports the time it was empty (:meth:`Debloater.idle`). Every ``PERIOD_S`` the debloater
computes the consumer's throughput over the *busy* part of the period (records ÷ (elapsed
− idle), as Flink does: an idle consumer says nothing about how fast it could go),
smooths it (exponential moving average) and sets the channel's **bound**:

* ``records`` = throughput × ``target_s``, within ``[FLOOR_RECORDS, ceiling]`` where the
  ceiling is ``ceiling_frames × batch_size`` records: ``channel_capacity`` frames for an
  in-process channel (what it held before debloating), ``REMOTE_CEILING_FACTOR`` times that
  for a remote one (whose queue, connection and receiver together held more);
* ``frames`` = ``records`` ÷ the average records per frame, within ``[1, ceiling frames]``;
* ``bytes`` = ``records`` × the average pickled bytes per record (remote channels; 0 for an
  in-process channel, whose frames are never pickled).

Below the ceiling, the bound limits everything in the channel: the sender's queue, the TCP
connection's buffers and the receiver's queue together (:class:`~runtime.network.outputs.RemoteOutput`
counts what it queued and sent against what the receiver reports consumed). So a barrier
waits behind at most about ``target_s`` of its consumer's work per exchange. At the ceiling
(the consumer keeps up) a remote channel holds what it held without debloating (the sender
goes by its queue) and no consumption is reported.
"""

from __future__ import annotations

import math
import time

PERIOD_S = 0.2  # how often the bound adapts (Flink: 200 ms)
SMOOTHING = 0.5  # weight of the newest period in the moving average
FLOOR_RECORDS = 16  # never fewer: a channel must be able to carry a small frame
# a remote channel's ceiling: this x channel_capacity frames, about what its sender queue, TCP
# buffers and receiver queue held before debloating (with 4, bench runtime's 10^6-key job, which
# is never back-pressured long enough for the bound to drop below the ceiling, ran slower)
REMOTE_CEILING_FACTOR = 8
MIN_BUSY_S = 0.005  # a period busier than this tells the throughput


class Debloater:
    """Throughput of one channel's consumer and the bound derived from it."""

    __slots__ = ("target_s", "ceiling_frames", "ceiling_records", "frames", "records", "bytes",
                 "rate", "bytes_per_record", "records_per_frame", "_t0", "_idle_s", "_n_records",
                 "_n_frames", "_n_bytes", "_n_bytes_records")  # fmt: skip

    def __init__(self, target_s: float, ceiling_frames: int, batch_size: int) -> None:
        self.target_s = target_s
        self.ceiling_frames = ceiling_frames
        self.ceiling_records = self.ceiling_frames * batch_size
        # the bound: until a first period is measured, the ceiling
        self.frames = self.ceiling_frames
        self.records = self.ceiling_records
        self.bytes = 0
        self.rate: float | None = None  # smoothed records per busy second
        self.bytes_per_record = 0.0
        self.records_per_frame = float(batch_size)
        self._t0 = time.monotonic()
        self._idle_s = 0.0
        self._n_records = self._n_frames = self._n_bytes = self._n_bytes_records = 0

    def idle(self, seconds: float) -> None:
        """The channel was empty for ``seconds`` (its consumer waited for input). Called by
        whoever puts the next frame (a remote channel's reader thread): an update lost to the
        task thread's :meth:`adapt` only skews one period's throughput."""
        self._idle_s += seconds

    def consumed(self, records: int, nbytes: int, now: float) -> bool:
        """The consumer took a frame of ``records`` records (``nbytes`` pickled, 0 if not);
        True when the bound changed (a period ended)."""
        self._n_frames += 1
        self._n_records += records
        if nbytes:
            self._n_bytes += nbytes
            self._n_bytes_records += records
        if now - self._t0 < PERIOD_S:
            return False
        self.adapt(now)
        return True

    def below_ceiling(self) -> bool:
        """The bound is below the ceiling (the consumer cannot take a ceiling's worth per target)."""
        return self.frames < self.ceiling_frames or self.records < self.ceiling_records

    def adapt(self, now: float) -> None:
        """End the current period: update the throughput and the bound."""
        elapsed = now - self._t0
        busy = elapsed - min(self._idle_s, elapsed)
        if busy >= MIN_BUSY_S and self._n_records:
            rate = self._n_records / busy
            self.rate = rate if self.rate is None else SMOOTHING * rate + (1 - SMOOTHING) * self.rate
            rpf = self._n_records / self._n_frames
            self.records_per_frame = SMOOTHING * rpf + (1 - SMOOTHING) * self.records_per_frame
        if self._n_bytes_records:
            bpr = self._n_bytes / self._n_bytes_records
            self.bytes_per_record = bpr if not self.bytes_per_record else (
                SMOOTHING * bpr + (1 - SMOOTHING) * self.bytes_per_record)  # fmt: skip
        if self.rate is not None:
            self.records = int(min(self.ceiling_records, max(FLOOR_RECORDS, self.rate * self.target_s)))
            frames = math.ceil(self.records / max(1.0, self.records_per_frame))
            self.frames = min(self.ceiling_frames, max(1, frames))
            self.bytes = int(self.records * self.bytes_per_record)
        self._t0 = now
        self._idle_s = 0.0
        self._n_records = self._n_frames = self._n_bytes = self._n_bytes_records = 0
