"""Channels: how records, watermarks and barriers travel between tasks.

A channel carries **frames** from one upstream subtask to one downstream subtask of an edge,
in order. A frame is ``(records, event)``: a batch of ``(value, timestamp)`` records
followed by at most one event (``("wm", t)`` or ``("barrier", checkpoint_id)``), so events
stay in line with the records before them.

* Inside one worker a channel is the downstream task's :class:`InputChannel` itself: the
  upstream task (same thread) appends frames as Python objects.
* Between workers it is one TCP connection on loopback per channel: the upstream task
  pickles frames into :class:`RemoteOutput`'s queue, a sender thread writes them
  length-prefixed; on the other side a reader thread of :class:`ChannelServer` puts them
  into the :class:`InputChannel`.

Every TCP connection starts with the mutual HMAC handshake of :mod:`runtime.auth` (the job
secret): the server reads no frame, and so unpickles nothing, from a peer that failed it;
such a connection is closed and logged, and the job goes on.

**Back-pressure**: an :class:`InputChannel` holds at most ``capacity`` frames; a full one
makes its reader thread stop reading, so TCP's window fills and the sender thread blocks;
its queue then grows and the upstream task stops running (a task runs only while every
output has fewer than ``capacity`` frames queued). One connection per channel means a
channel blocked by barrier alignment never stalls another channel.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from runtime.auth import handshake
from runtime.debloat import Debloater
from runtime.errors import PeerAuthenticationError

log = logging.getLogger(__name__)

WATERMARK = "wm"
BARRIER = "barrier"
_LEN = struct.Struct("!I")
# a frame whose length has this bit set is an urgent barrier: it overtakes the queued frames
URGENT = 1 << 31
# receiver -> sender on a remote channel's connection, after every frame the receiver took:
# frames and records consumed so far, the channel's bound in frames and records (0: none)
_CREDIT = struct.Struct("!QQII")
CONNECT_TIMEOUT_S = 30.0
# Kernel buffers of a channel's TCP connection. Loopback autotuning grows them to megabytes,
# i.e. hundreds of frames (a second of records) between two tasks, which barriers queue behind
# (alignment time) and back-pressure reacts to late; 64 KiB per side keeps a few dozen frames.
SOCKET_BUFFER_BYTES = 64 << 10


class InputChannel:
    """Frames of one channel waiting for the downstream task.

    ``debloater`` (None: debloating off) bounds the channel by its consumer's throughput
    (:mod:`runtime.debloat`); off, the bound is ``capacity`` frames. The task thread takes
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
            self.feedback.sendall(_CREDIT.pack(self.consumed_frames, self.consumed_records, d.frames, d.records))  # type: ignore[union-attr]
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
                data = _recv_exact(sock, _CREDIT.size)
                if data is None:
                    return
                frames, records, self.bound_frames, bound_records = _CREDIT.unpack(data)
                if bound_records:
                    self.bound_records = bound_records
                self.consumed_records, self.consumed_frames = records, frames
                if self.wake is not None and self.debloat and self.sent_frames - frames < self.bound_frames:
                    self.wake.set()
        except OSError:
            return  # the sender thread reports a broken connection

    def _run(self) -> None:
        try:
            sock = _connect(self.address)
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
            sock.sendall(_LEN.pack(len(hello)) + hello)
            threading.Thread(target=self._credits, args=(sock,), name=f"credit-{self.channel_id}",
                             daemon=True).start()  # fmt: skip
            while True:
                data = self.q.get()
                if data is None:
                    break
                if self.wake is not None and self.q.qsize() < self.capacity:
                    self.wake.set()
                if isinstance(data, tuple):  # an urgent barrier
                    sock.sendall(_LEN.pack(len(data[0]) | URGENT) + data[0])
                    continue
                sock.sendall(_LEN.pack(len(data)))
                sock.sendall(data)
        except OSError as e:
            if not self.closing:
                self.on_error(f"channel {self.channel_id}: sending to {self.address} failed: {e}")
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _connect(address: tuple[str, int]) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            sock.settimeout(5.0)
            sock.connect(address)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)


class ChannelServer:
    """The listening socket of a worker: accepts one connection per incoming remote channel.

    ``secret``: the job secret every connection must prove (:mod:`runtime.auth`); ``host``:
    the address to listen on (loopback for a job on one machine)."""

    def __init__(self, on_error: Callable[[str], None], secret: bytes, host: str = "127.0.0.1") -> None:
        self._secret = secret
        self.refused = 0  # connections that failed the handshake (closed, nothing read)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # set before listen: accepted connections inherit it (and the window scale it implies)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        self.sock.bind((host, 0))
        self.sock.listen()
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.channels: dict[tuple[int, int, int], InputChannel] = {}
        self.ready = threading.Event()  # set once ``channels`` is complete
        self.on_error = on_error
        self.closing = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, name="channel-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn, peer), name="channel-read", daemon=True).start()

    def _read(self, conn: socket.socket, peer: Any = None) -> None:
        channel_id: Any = None
        try:
            try:
                handshake(conn, self._secret, connected=False)
            except (PeerAuthenticationError, OSError) as e:
                self.refused += 1
                if not self.closing:
                    log.warning("refused a channel connection from %s: %s", peer, e)
                return
            head = _recv_exact(conn, _LEN.size)
            if head is None:
                return
            hello = _recv_exact(conn, _LEN.unpack(head)[0])
            if hello is None:
                return
            channel_id = pickle.loads(hello)
            self.ready.wait()
            channel = self.channels.get(channel_id)
            if channel is None:
                self.on_error(f"connection for unknown channel {channel_id}")
                return
            channel.attach(conn)
            while True:
                head = _recv_exact(conn, _LEN.size)
                if head is None:
                    return  # the upstream worker stopped or died: the job master handles it
                n = _LEN.unpack(head)[0]
                data = _recv_exact(conn, n & ~URGENT)
                if data is None:
                    return
                if n & URGENT:
                    channel.put_urgent(pickle.loads(data))
                else:
                    channel.put_blocking(data)
        except OSError as e:
            if not self.closing:
                log.debug("channel %s: read failed: %s", channel_id, e)
        finally:
            conn.close()

    def close(self) -> None:
        self.closing = True
        for ch in self.channels.values():
            ch.close()
        with contextlib.suppress(OSError):
            self.sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.close()
