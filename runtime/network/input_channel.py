"""The downstream end of a channel: the frames waiting for the task that reads them.

Inside one worker the upstream task appends frames to the :class:`InputChannel` itself (as
Python objects); between workers the reader thread of :class:`~runtime.network.server.ChannelServer`
appends the pickled frames it receives. **Back-pressure**: an :class:`InputChannel` holds at
most ``capacity`` frames (or the bound its :class:`~runtime.network.debloat.Debloater` sets);
a full one makes its reader thread stop reading, so TCP's window fills and the sender blocks.
"""

from __future__ import annotations

import pickle
import socket
import threading
import time
from collections import deque
from typing import Any

from runtime.network.debloat import Debloater
from runtime.network.frames import CREDIT


class InputChannel:
    """Frames of one channel waiting for the downstream task.

    ``debloater`` (None: debloating off) bounds the channel by its consumer's throughput
    (:mod:`runtime.network.debloat`); off, the bound is ``capacity`` frames. The task thread takes
    frames with :meth:`poll` (remote frames are unpickled there), which also reports the
    consumption to the sender of a remote channel (``feedback``: its connection)."""

    __slots__ = ("index", "label", "capacity", "q", "cond", "waiting", "wake", "closed", "debloater",
                 "feedback", "queued_records", "bytes_in", "bytes_out", "consumed_frames", "consumed_records",
                 "puts", "polls", "urgent", "_empty_since", "_reported",
                 "_reported_records")  # fmt: skip

    def __init__(self, index: int, capacity: int, wake: threading.Event, debloater: Debloater | None = None,
                 label: str = "") -> None:  # fmt: skip
        self.index = index
        self.label = label  # "<edge>.<upstream subtask>-<downstream subtask>" (metrics)
        self.capacity = capacity
        self.q: deque[Any] = deque()
        self.cond = threading.Condition()
        self.waiting = False
        self.wake = wake
        self.closed = False
        self.debloater = debloater
        self.feedback: socket.socket | None = None
        self.queued_records = 0  # of in-process frames (remote ones are pickled)
        # pickled bytes of remote frames put (reader thread) and taken (task thread): one writer each
        self.bytes_in = self.bytes_out = 0
        self.consumed_frames = 0
        self.consumed_records = 0
        self.puts = 0  # frames ever appended to ``q``
        self.polls = 0  # frames ever taken from ``q``
        # priority barriers (unaligned mode): (frame, ``puts`` when it arrived), ahead of ``q``
        self.urgent: deque[tuple[Any, int]] = deque()
        self._empty_since: float | None = time.monotonic()
        # consumed_frames and consumed_records in the last report to a remote sender
        self._reported = self._reported_records = 0

    def _arrived(self) -> None:
        since = self._empty_since
        if since is not None:
            self._empty_since = None
            if self.debloater is not None:
                self.debloater.idle(time.monotonic() - since)

    def put(self, frame: Any) -> None:
        """From the task thread of the same worker (never blocks)."""
        self.queued_records += len(frame[0])
        self.q.append(frame)
        self.puts += 1
        self._arrived()

    def put_urgent(self, frame: Any) -> None:
        """A barrier that overtakes the frames queued so far (unaligned mode)."""
        self.urgent.append((frame, self.puts))
        self._arrived()
        self.wake.set()

    def put_blocking(self, frame: Any) -> None:
        """From a reader thread: waits while the channel is full (back-pressure)."""
        if len(self.q) >= self.capacity:
            with self.cond:
                self.waiting = True
                while len(self.q) >= self.capacity and not self.closed:
                    self.cond.wait(0.05)
                self.waiting = False
        self.bytes_in += len(frame)
        self.q.append(frame)
        self.puts += 1
        self._arrived()
        self.wake.set()

    def attach(self, conn: socket.socket) -> None:
        """The connection of a remote channel: :meth:`poll` reports consumption on it (and
        the bound at once if it is below the ceiling the sender starts from)."""
        self.feedback = conn
        d = self.debloater
        if d is not None and d.below_ceiling():
            self._report(d)

    def poll(self) -> Any:
        """The next frame as ``(records, event)``, or None."""
        q = self.q
        if self.urgent and self.polls >= self.urgent[0][1]:
            return None  # the frames behind an urgent barrier wait until the task handled it
        if not q:
            if self._empty_since is None:
                self._empty_since = time.monotonic()
            return None
        frame = q.popleft()
        self.polls += 1
        if self.waiting:
            with self.cond:
                self.cond.notify()
        nbytes = 0
        if isinstance(frame, bytes):
            nbytes = len(frame)
            self.bytes_out += nbytes
            frame = pickle.loads(frame)
            records = len(frame[0])
        else:
            records = len(frame[0])
            self.queued_records -= records
        self.consumed_frames += 1
        self.consumed_records += records
        d = self.debloater
        if d is not None:
            changed = d.consumed(records, nbytes, time.monotonic())
            # Report to a remote sender when the bound changed and, below the ceiling, once a
            # quarter of the bound (frames or records) was taken since the last report (at the
            # ceiling the sender goes by its queue alone). A report is a send on the task
            # thread, and each one hands the GIL to the other threads (per frame, that cost ~9 %
            # of the task thread's time). The sender sees less room than there is by less than
            # a quarter of the bound, so it blocks only with more than a quarter of the bound
            # still to be taken here, whose taking reports again: it never waits for a report
            # that does not come
            if self.feedback is not None and (
                changed
                or (d.below_ceiling() and (self.consumed_frames - self._reported >= d.frames >> 2
                                           or self.consumed_records - self._reported_records >= d.records >> 2))
            ):  # fmt: skip
                self._report(d)
        return frame

    def queued(self, n: int) -> list[Any]:
        """The first ``n`` frames still queued, as ``(records, event)`` (not taken)."""
        q = self.q  # by index: the reader thread may append meanwhile (never pops)
        frames = [q[i] for i in range(n)]
        return [pickle.loads(f) if isinstance(f, bytes) else f for f in frames]

    def _report(self, d: Debloater) -> None:
        """Tell the remote sender what was taken and the bound (debloating only)."""
        self._reported, self._reported_records = self.consumed_frames, self.consumed_records
        try:
            self.feedback.sendall(CREDIT.pack(self.consumed_frames, self.consumed_records, d.frames, d.records))  # type: ignore[union-attr]
        except OSError:
            self.feedback = None  # the sender is gone: the job master handles it

    @property
    def queued_bytes(self) -> int:
        return self.bytes_in - self.bytes_out

    def bound(self) -> tuple[int, int, int]:
        """What the channel may hold now: (frames, records, bytes); records 0: no record bound."""
        d = self.debloater
        if d is None:
            return self.capacity, 0, 0
        return d.frames, d.records, d.bytes

    def has_room(self, frame_records: int = 1) -> bool:
        """For an in-process sender: room for another frame of up to ``frame_records`` records
        (with debloating the records then queued stay within the bound)."""
        d = self.debloater
        if d is None:
            return len(self.q) < self.capacity
        return len(self.q) < d.frames and self.queued_records + frame_records <= d.records

    def backlog(self) -> int:
        return len(self.q)

    def close(self) -> None:
        self.closed = True
        with self.cond:
            self.cond.notify_all()
