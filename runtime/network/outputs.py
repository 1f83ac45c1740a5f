"""The upstream ends of channels: :class:`LocalOutput` into an input channel of the same
worker, :class:`RemoteOutput` to another worker (a queue and a sender thread).

A task runs only while every output has room for another frame (see
:mod:`runtime.network.input_channel` for the back-pressure this gives); one connection per
channel means a channel blocked by barrier alignment never stalls another channel.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from runtime.errors import PeerAuthenticationError
from runtime.network.auth import handshake
from runtime.network.frames import CREDIT, LENGTH, URGENT, connect, recv_exact
from runtime.network.input_channel import InputChannel


class _Pressure:
    """Seconds a sender found its channel full (``backpressured_s``), from :meth:`_room`."""

    __slots__ = ()
    backpressured_s: float
    _bp_since: float | None

    def _room(self, room: bool) -> bool:
        if room:
            if self._bp_since is not None:
                self.backpressured_s += time.monotonic() - self._bp_since
                self._bp_since = None
        elif self._bp_since is None:
            self._bp_since = time.monotonic()
        return room


class LocalOutput(_Pressure):
    """Upstream end of a channel inside one worker."""

    __slots__ = ("target", "backpressured_s", "_bp_since")

    def __init__(self, target: InputChannel) -> None:
        self.target = target
        self.backpressured_s = 0.0
        self._bp_since: float | None = None

    @property
    def label(self) -> str:
        return self.target.label

    def send(self, frame: tuple[list[Any], Any]) -> None:
        self.target.put(frame)

    def send_urgent(self, frame: tuple[list[Any], Any]) -> None:
        self.target.put_urgent(frame)

    def take_queued(self) -> list[Any]:
        return []  # the receiver's queue: the downstream task records what its barrier overtook

    def requeue(self, items: list[Any]) -> None:
        pass

    def has_room(self, frame_records: int = 1) -> bool:
        return self._room(self.target.has_room(frame_records))

    def frame_limit(self, batch_size: int) -> int:
        d = self.target.debloater
        return batch_size if d is None else max(1, min(batch_size, d.records // 2))

    def buffered(self) -> tuple[int, int]:
        """(frames, records) in the channel."""
        return len(self.target.q), self.target.queued_records

    def backlog(self) -> int:
        return self.target.backlog()

    def close(self) -> None:
        pass


class RemoteOutput(_Pressure):
    """Upstream end of a channel to another worker: a queue and a sender thread.

    With debloating (``debloat``: the ceiling) and the receiver's bound below the ceiling,
    the room in the channel is that bound minus what this end sent or queued and the
    receiver has not taken yet (its reports arrive on the same connection, read by a second
    thread): the queue, the TCP buffers and the receiver's queue all count. Without, or at
    the ceiling, the queue holds up to ``capacity`` frames."""

    def __init__(
        self,
        address: tuple[str, int],
        channel_id: tuple[int, int, int],
        on_error: Callable[[str], None],
        wake: threading.Event | None = None,
        capacity: int = 0,
        debloat: tuple[int, int] | None = None,
        *,
        secret: bytes,
    ) -> None:
        self.address = address
        self._secret = secret
        self.channel_id = channel_id
        self.label = f"{channel_id[0]}.{channel_id[1]}-{channel_id[2]}"
        self.on_error = on_error
        # set when the queue drops below ``capacity``: a task blocked by back-pressure on
        # this channel runs again at once instead of after its idle wait
        self.wake = wake
        self.capacity = capacity
        self.debloat = debloat is not None
        # the receiver's bound (frames, records): the ceiling until its first report
        self.ceiling_frames, self.ceiling_records = debloat or (capacity, 0)
        self.bound_frames, self.bound_records = self.ceiling_frames, self.ceiling_records
        self.sent_frames = self.sent_records = 0  # queued or sent so far
        self.consumed_frames = self.consumed_records = 0  # as the receiver last reported
        self.backpressured_s = 0.0
        self._bp_since: float | None = None
        self.q: queue.Queue[Any] = queue.Queue()  # pickled frames, (urgent frame,), None: close
        self.closing = False
        self.thread = threading.Thread(target=self._run, name=f"send-{channel_id}", daemon=True)
        self.thread.start()

    def send(self, frame: tuple[list[Any], Any]) -> None:
        self.sent_frames += 1
        self.sent_records += len(frame[0])
        self.q.put(pickle.dumps(frame, protocol=5))

    def send_urgent(self, frame: tuple[list[Any], Any]) -> None:
        """A barrier frame (no records) marked to overtake the receiver's queue."""
        self.q.put((pickle.dumps(frame, protocol=5),))  # not counted: the receiver does not poll it

    def take_queued(self) -> list[Any]:
        """Take what is not yet handed to the connection out of the queue, in order, for
        :meth:`requeue` (still counted as sent).

        Atomically, under the queue's own lock: taken one by one, the sender thread could get
        a frame between two takes and send it ahead of the frames taken before it (which go
        behind the barrier), breaking the channel's order."""
        with self.q.mutex:  # queue.Queue's lock, held by every put and get
            pending = self.q.queue
            out = []
            while pending and pending[0] is not None:  # (None: close, stays queued)
                out.append(pending.popleft())
            return out

    def requeue(self, items: list[Any]) -> None:
        for data in items:
            self.q.put(data)

    def has_room(self, frame_records: int = 1) -> bool:
        """Room for another frame of up to ``frame_records`` records."""
        if not self.debloat or (self.bound_frames >= self.ceiling_frames and self.bound_records >= self.ceiling_records):
            # at the ceiling (the receiver is not back-pressured), the queue alone counts, as
            # without debloating: the receiver then reports only a change of its bound
            return self._room(self.q.qsize() < self.capacity)
        return self._room(self.sent_frames - self.consumed_frames < self.bound_frames
                          and self.sent_records - self.consumed_records + frame_records <= self.bound_records)  # fmt: skip

    def frame_limit(self, batch_size: int) -> int:
        return max(1, min(batch_size, self.bound_records // 2)) if self.debloat else batch_size

    def buffered(self) -> tuple[int, int]:
        """(frames, records) queued, in the connection or at the receiver (as last reported)."""
        return self.sent_frames - self.consumed_frames, self.sent_records - self.consumed_records

    def backlog(self) -> int:
        return self.q.qsize()

    def close(self) -> None:
        self.closing = True
        self.q.put(None)

    def _credits(self, sock: socket.socket) -> None:
        """Read the receiver's consumption reports; wake the task when there is room again."""
        try:
            while True:
                data = recv_exact(sock, CREDIT.size)
                if data is None:
                    return
                frames, records, self.bound_frames, bound_records = CREDIT.unpack(data)
                if bound_records:
                    self.bound_records = bound_records
                self.consumed_records, self.consumed_frames = records, frames
                if self.wake is not None and self.debloat and self.sent_frames - frames < self.bound_frames:
                    self.wake.set()
        except OSError:
            return  # the sender thread reports a broken connection

    def _run(self) -> None:
        try:
            sock = connect(self.address)
        except OSError as e:
            if not self.closing:
                self.on_error(f"channel {self.channel_id}: cannot connect to {self.address}: {e}")
            return
        try:
            handshake(sock, self._secret, connected=True)
        except (PeerAuthenticationError, OSError) as e:
            sock.close()
            if not self.closing:
                self.on_error(f"channel {self.channel_id}: {self.address} failed the handshake: {e}")
            return
        try:
            hello = pickle.dumps(self.channel_id)
            sock.sendall(LENGTH.pack(len(hello)) + hello)
            threading.Thread(target=self._credits, args=(sock,), name=f"credit-{self.channel_id}",
                             daemon=True).start()  # fmt: skip
            while True:
                data = self.q.get()
                if data is None:
                    break
                if self.wake is not None and self.q.qsize() < self.capacity:
                    self.wake.set()
                if isinstance(data, tuple):  # an urgent barrier
                    sock.sendall(LENGTH.pack(len(data[0]) | URGENT) + data[0])
                    continue
                sock.sendall(LENGTH.pack(len(data)))
                sock.sendall(data)
        except OSError as e:
            if not self.closing:
                self.on_error(f"channel {self.channel_id}: sending to {self.address} failed: {e}")
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
