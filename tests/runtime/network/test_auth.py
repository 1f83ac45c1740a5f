"""Authenticated connections (runtime/network/auth.py): a channel server refuses a peer without the
job secret, and nothing such a peer sends is unpickled.

The hostile frames are pickles whose unpickling creates a file (``__reduce__`` calling
``open(path, "w")``): the file must not exist afterwards. A client with the secret, through
the same server, gets its frames delivered (so the refusals are not an artefact of a broken
server).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from runtime.cluster.spark import accept_control
from runtime.errors import PeerAuthenticationError
from runtime.network.auth import MAGIC, NONCE_BYTES, handshake, new_secret
from runtime.network.frames import LENGTH
from runtime.network.input_channel import InputChannel
from runtime.network.outputs import RemoteOutput
from runtime.network.server import ChannelServer
from tests.support.wait import wait_until

CHANNEL = (7, 0, 1)


class CreatesFile:
    """Unpickling this creates ``path``: the visible side effect of an unpickled frame."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj)
    return LENGTH.pack(len(data)) + data


def _read_to_eof(sock: socket.socket, timeout: float = 30.0) -> bytes:
    sock.settimeout(timeout)
    got = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


@pytest.fixture
def server() -> Any:
    errors: list[str] = []
    secret = new_secret()
    srv = ChannelServer(errors.append, secret)
    channel = InputChannel(0, 100, threading.Event())
    srv.channels[CHANNEL] = channel
    srv.ready.set()
    try:
        yield srv, secret, channel, errors
    finally:
        srv.close()


def test_the_handshake_passes_with_the_secret_and_fails_without_it() -> None:
    secret = new_secret()
    for other, ok in ((secret, True), (new_secret(), False)):
        a, b = socket.socketpair()
        outcome: dict[str, Any] = {}

        def accept(sock: socket.socket = b, other: bytes = other, outcome: dict[str, Any] = outcome) -> None:
            try:
                handshake(sock, other, connected=False)
                outcome["accept"] = "ok"
            except PeerAuthenticationError as e:
                outcome["accept"] = e

        t = threading.Thread(target=accept)
        t.start()
        try:
            handshake(a, secret, connected=True)
            outcome["connect"] = "ok"
        except PeerAuthenticationError as e:
            outcome["connect"] = e
        t.join(30)
        a.close()
        b.close()
        if ok:
            assert outcome == {"connect": "ok", "accept": "ok"}
        else:
            assert isinstance(outcome["connect"], PeerAuthenticationError)
            assert isinstance(outcome["accept"], PeerAuthenticationError)
            assert secret.hex() not in str(outcome["connect"]) and other.hex() not in str(outcome["accept"])


def test_a_raw_pickled_frame_without_the_handshake_is_refused_and_never_unpickled(
    server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv, secret, channel, errors = server
    marker = tmp_path / "unpickled"
    caplog.set_level(logging.WARNING, logger="runtime.network.server")
    with socket.create_connection(srv.address) as sock:
        # what a stranger would send: a hello that the server would unpickle, then a frame
        sock.sendall(_frame(CreatesFile(marker)) + _frame(([CreatesFile(marker)], None)))
        got = _read_to_eof(sock)
    assert not marker.exists(), "a frame of an unauthenticated peer was unpickled"
    # the server sent its handshake opening only, then closed the connection
    assert got[: len(MAGIC)] == MAGIC and len(got) == len(MAGIC) + NONCE_BYTES
    wait_until(lambda: srv.refused == 1, 30, "the refused connection", interval=0.02)
    assert channel.backlog() == 0 and errors == []  # a stranger does not fail the job
    assert "refused a channel connection" in caplog.text and secret.hex() not in caplog.text


def test_a_client_with_a_wrong_secret_is_refused_and_its_frames_are_not_unpickled(
    server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    srv, secret, channel, errors = server
    marker = tmp_path / "unpickled"
    caplog.set_level(logging.WARNING, logger="runtime.network.server")
    with socket.create_connection(srv.address) as sock:
        with pytest.raises(PeerAuthenticationError, match="proof does not match"):
            handshake(sock, new_secret(), connected=True)
        with pytest.raises(OSError):  # noqa: PT012 - the server closes; sending fails sooner or later
            for _ in range(200):
                sock.sendall(_frame(CreatesFile(marker)) + _frame(([CreatesFile(marker)], None)))
                time.sleep(0.01)
    wait_until(lambda: srv.refused == 1, 30, "the refused connection", interval=0.02)
    assert not marker.exists(), "a frame of a peer with a wrong secret was unpickled"
    assert channel.backlog() == 0 and errors == []
    assert secret.hex() not in caplog.text


def test_a_sender_with_the_secret_gets_its_frames_through(server: Any) -> None:
    srv, secret, channel, errors = server
    out = RemoteOutput(srv.address, CHANNEL, errors.append, secret=secret)
    out.send(([("a", 1)], None))
    out.send(([], ("barrier", 3)))
    wait_until(lambda: channel.backlog() == 2, 30, "a backlog of 2", interval=0.02)
    out.close()
    frames = [channel.poll(), channel.poll()]  # (unpickled by poll)
    assert frames == [([("a", 1)], None), ([], ("barrier", 3))]
    assert srv.refused == 0 and errors == []


def test_a_sender_with_a_wrong_secret_reports_a_failed_handshake(server: Any) -> None:
    srv, _secret, channel, _errors = server
    reported: list[str] = []
    out = RemoteOutput(srv.address, CHANNEL, reported.append, secret=new_secret())
    out.send(([("a", 1)], None))
    wait_until(lambda: bool(reported), 30, "the reported failure", interval=0.02)
    assert "failed the handshake" in reported[0]
    assert channel.backlog() == 0
    wait_until(lambda: srv.refused == 1, 30, "the refused connection", interval=0.02)
    out.close()


@pytest.mark.parametrize("client", ["raw-pickle", "wrong-secret", "right-secret"])
def test_the_control_listener_of_spark_workers_unpickles_only_after_the_handshake(
    tmp_path: Path, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``accept_control`` (the job master's TCP control listener of cluster="spark")."""
    secret = new_secret()
    marker = tmp_path / "unpickled"
    caplog.set_level(logging.WARNING, logger="runtime.cluster.spark")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sock = socket.create_connection(listener.getsockname()[:2])
        accepted, peer = listener.accept()
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(accept_control(accepted, peer, secret, 4, set())))
        t.start()
        if client == "raw-pickle":
            sock.sendall(_frame(CreatesFile(marker)) + _frame(("ready", 0, ("127.0.0.1", 1), CreatesFile(marker))))
        else:
            with contextlib.suppress(PeerAuthenticationError):
                handshake(sock, secret if client == "right-secret" else new_secret(), connected=True)
            pid = 1234 if client == "right-secret" else CreatesFile(marker)
            with contextlib.suppress(OSError):
                Connection(os.dup(sock.fileno())).send(("ready", 2, ("127.0.0.1", 1), pid))
        t.join(60)
        sock.close()
    assert not marker.exists(), "a control frame of an unauthenticated peer was unpickled"
    if client == "right-secret":
        index, conn, address, pid = result[0]
        conn.close()
        assert (index, address, pid) == (2, ("127.0.0.1", 1), 1234)
    else:
        assert result == [None]
        assert "refused a control connection" in caplog.text and secret.hex() not in caplog.text
