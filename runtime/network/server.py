"""The listening socket of a worker: one connection per incoming remote channel.

Every connection starts with the mutual HMAC handshake of :mod:`runtime.network.auth` (the
job secret): the server reads no frame, and so unpickles nothing, from a peer that failed
it; such a connection is closed and logged, and the job goes on.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import threading
from collections.abc import Callable
from typing import Any

from runtime.errors import PeerAuthenticationError
from runtime.network.auth import handshake
from runtime.network.frames import LENGTH, SOCKET_BUFFER_BYTES, URGENT, recv_exact
from runtime.network.input_channel import InputChannel

log = logging.getLogger(__name__)


class ChannelServer:
    """The listening socket of a worker: accepts one connection per incoming remote channel.

    ``secret``: the job secret every connection must prove (:mod:`runtime.network.auth`); ``host``:
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
            head = recv_exact(conn, LENGTH.size)
            if head is None:
                return
            hello = recv_exact(conn, LENGTH.unpack(head)[0])
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
                head = recv_exact(conn, LENGTH.size)
                if head is None:
                    return  # the upstream worker stopped or died: the job master handles it
                n = LENGTH.unpack(head)[0]
                data = recv_exact(conn, n & ~URGENT)
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
