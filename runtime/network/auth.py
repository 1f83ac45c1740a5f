"""Authenticated connections: a mutual HMAC challenge-response on every TCP connection
between the job master and its workers, and between workers, before any frame is read.

The job master makes one **job secret** per run (:func:`new_secret`, 32 random bytes) and
hands it to its workers out of band: in the arguments of a local worker process, or in the
closure of a Spark barrier task. It never travels over a channel, never appears in a log,
a repr or an error message.

The handshake (docs/runtime.md, "Authenticated connections"), the same on both sides:

1. each side sends ``MAGIC`` (8 bytes: ``b"SLAUTH"`` and the version, big-endian u16) and a
   fresh random 32-byte nonce;
2. each side checks the peer's magic, then sends
   ``HMAC-SHA256(secret, role || peer nonce || own nonce)`` with ``role`` ``b"connect"``
   for the side that connected and ``b"accept"`` for the side that accepted (a peer cannot
   reflect a side's own proof back to it);
3. each side compares the peer's proof with the one it expects (``hmac.compare_digest``).

Only then does a side read frames, and so unpickle anything. A connection whose handshake
fails (wrong magic, wrong proof, closed or silent for ``HANDSHAKE_TIMEOUT_S``) is closed by
the caller and logged with the peer's address; nothing it sent is ever unpickled. The
handshake authenticates; it does not encrypt: run clusters on a private network.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct

from runtime.errors import PeerAuthenticationError

SECRET_BYTES = 32
NONCE_BYTES = 32
VERSION = 1
MAGIC = b"SLAUTH" + struct.pack("!H", VERSION)
HANDSHAKE_TIMEOUT_S = 10.0
CONNECT = b"connect"
ACCEPT = b"accept"


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise PeerAuthenticationError(f"the peer closed the connection after {len(buf)} of {n} handshake bytes")
        buf += chunk
    return bytes(buf)


def _proof(secret: bytes, role: bytes, peer_nonce: bytes, own_nonce: bytes) -> bytes:
    return hmac.new(secret, role + peer_nonce + own_nonce, hashlib.sha256).digest()


def handshake(sock: socket.socket, secret: bytes, *, connected: bool, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Prove knowledge of ``secret`` to the peer and check its proof; raises
    :class:`PeerAuthenticationError` (or :class:`OSError`) on failure. ``connected``: this side
    connected (else it accepted). The socket's timeout is restored afterwards."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise PeerAuthenticationError("the job secret must be at least 16 bytes")
    own_role, peer_role = (CONNECT, ACCEPT) if connected else (ACCEPT, CONNECT)
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(MAGIC + nonce)
        magic = _recv_exact(sock, len(MAGIC))
        if magic != MAGIC:
            raise PeerAuthenticationError(f"the peer sent no statelog handshake (got {magic[:len(MAGIC)]!r})")
        peer_nonce = _recv_exact(sock, NONCE_BYTES)
        sock.sendall(_proof(secret, own_role, peer_nonce, nonce))
        expected = _proof(secret, peer_role, nonce, peer_nonce)
        if not hmac.compare_digest(_recv_exact(sock, len(expected)), expected):
            raise PeerAuthenticationError("the peer's proof does not match the job secret")
    except TimeoutError:
        raise PeerAuthenticationError(f"no handshake from the peer within {timeout}s") from None
    finally:
        sock.settimeout(previous)
