"""The wire format of a remote channel and the socket helpers both of its ends use.

A frame is ``(records, event)``: a batch of ``(value, timestamp)`` records followed by at
most one event (``(WATERMARK, t)`` or ``(BARRIER, checkpoint_id)``). On a TCP connection,
after the handshake of :mod:`runtime.network.auth` and the pickled channel id, every frame
is its pickle prefixed by its length (:data:`LENGTH`); the bit :data:`URGENT` of the length
marks an urgent barrier. The receiver reports what it consumed on the same connection
(:data:`CREDIT`).
"""

from __future__ import annotations

import socket
import struct
import time

WATERMARK = "wm"
BARRIER = "barrier"
LENGTH = struct.Struct("!I")
# a frame whose length has this bit set is an urgent barrier: it overtakes the queued frames
URGENT = 1 << 31
# receiver -> sender on a remote channel's connection, after every frame the receiver took:
# frames and records consumed so far, the channel's bound in frames and records (0: none)
CREDIT = struct.Struct("!QQII")
CONNECT_TIMEOUT_S = 30.0
# Kernel buffers of a channel's TCP connection. Loopback autotuning grows them to megabytes,
# i.e. hundreds of frames (a second of records) between two tasks, which barriers queue behind
# (alignment time) and back-pressure reacts to late; 64 KiB per side keeps a few dozen frames.
SOCKET_BUFFER_BYTES = 64 << 10


def connect(address: tuple[str, int]) -> socket.socket:
    """A connection to ``address``, retried for up to ``CONNECT_TIMEOUT_S`` (the peer's
    server may not listen yet)."""
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


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``sock``; None when the peer closed the connection first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)
