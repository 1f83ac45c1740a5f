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

from runtime.auth import AuthenticationError, handshake

log = logging.getLogger(__name__)

WATERMARK = "wm"
BARRIER = "barrier"
_LEN = struct.Struct("!I")
CONNECT_TIMEOUT_S = 30.0
# Kernel buffers of a channel's TCP connection. Loopback autotuning grows them to megabytes,
# i.e. hundreds of frames (a second of records) between two tasks, which barriers queue behind
# (alignment time) and back-pressure reacts to late; 64 KiB per side keeps a few dozen frames.
SOCKET_BUFFER_BYTES = 64 << 10


class InputChannel:
    """Frames of one channel waiting for the downstream task."""

    __slots__ = ("index", "capacity", "q", "cond", "waiting", "wake", "closed")

    def __init__(self, index: int, capacity: int, wake: threading.Event) -> None:
        self.index = index
        self.capacity = capacity
        self.q: deque[Any] = deque()
        self.cond = threading.Condition()
        self.waiting = False
        self.wake = wake
        self.closed = False

    def put(self, frame: Any) -> None:
        """From the task thread of the same worker (never blocks)."""
        self.q.append(frame)

    def put_blocking(self, frame: Any) -> None:
        """From a reader thread: waits while the channel is full (back-pressure)."""
        if len(self.q) >= self.capacity:
            with self.cond:
                self.waiting = True
                while len(self.q) >= self.capacity and not self.closed:
                    self.cond.wait(0.05)
                self.waiting = False
        self.q.append(frame)
        self.wake.set()

    def poll(self) -> Any:
        q = self.q
        if not q:
            return None
        frame = q.popleft()
        if self.waiting:
            with self.cond:
                self.cond.notify()
        return frame

    def backlog(self) -> int:
        return len(self.q)

    def close(self) -> None:
        self.closed = True
        with self.cond:
            self.cond.notify_all()


class LocalOutput:
    """Upstream end of a channel inside one worker."""

    __slots__ = ("target",)

    def __init__(self, target: InputChannel) -> None:
        self.target = target

    def send(self, frame: tuple[list[Any], Any]) -> None:
        self.target.put(frame)

    def backlog(self) -> int:
        return self.target.backlog()

    def close(self) -> None:
        pass


class RemoteOutput:
    """Upstream end of a channel to another worker: a queue and a sender thread."""

    def __init__(
        self,
        address: tuple[str, int],
        channel_id: tuple[int, int, int],
        on_error: Callable[[str], None],
        wake: threading.Event | None = None,
        capacity: int = 0,
        *,
        secret: bytes,
    ) -> None:
        self.address = address
        self._secret = secret
        self.channel_id = channel_id
        self.on_error = on_error
        # set when the queue drops below ``capacity``: a task blocked by back-pressure on
        # this channel runs again at once instead of after its idle wait
        self.wake = wake
        self.capacity = capacity
        self.q: queue.Queue[bytes | None] = queue.Queue()
        self.closing = False
        self.thread = threading.Thread(target=self._run, name=f"send-{channel_id}", daemon=True)
        self.thread.start()

    def send(self, frame: tuple[list[Any], Any]) -> None:
        self.q.put(pickle.dumps(frame, protocol=5))

    def backlog(self) -> int:
        return self.q.qsize()

    def close(self) -> None:
        self.closing = True
        self.q.put(None)

    def _run(self) -> None:
        try:
            sock = _connect(self.address)
        except OSError as e:
            if not self.closing:
                self.on_error(f"channel {self.channel_id}: cannot connect to {self.address}: {e}")
            return
        try:
            handshake(sock, self._secret, connected=True)
        except (AuthenticationError, OSError) as e:
            sock.close()
            if not self.closing:
                self.on_error(f"channel {self.channel_id}: {self.address} failed the handshake: {e}")
            return
        try:
            hello = pickle.dumps(self.channel_id)
            sock.sendall(_LEN.pack(len(hello)) + hello)
            while True:
                data = self.q.get()
                if data is None:
                    break
                if self.wake is not None and self.q.qsize() < self.capacity:
                    self.wake.set()
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
            except (AuthenticationError, OSError) as e:
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
            while True:
                head = _recv_exact(conn, _LEN.size)
                if head is None:
                    return  # the upstream worker stopped or died: the job master handles it
                data = _recv_exact(conn, _LEN.unpack(head)[0])
                if data is None:
                    return
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
