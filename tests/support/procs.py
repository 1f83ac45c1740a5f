"""Helpers for the server processes the tests start (SeaweedFS, the Kafka broker): free
loopback ports, a child that dies with the test process, its log tail, and a clean stop."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import socket
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)


def free_ports(count: int) -> list[int]:
    """Reserve ``count`` distinct free loopback ports (released just before use)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def set_pdeathsig() -> None:  # pragma: no cover - runs in the child before exec
    """Have the kernel send SIGTERM to the child if the test process dies (Linux only)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


def stop_process(proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    """Terminate ``proc``, killing it if it does not stop within ``timeout``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        logger.warning("%s pid %d did not stop in %.0fs; killing", what, proc.pid, timeout)
        proc.kill()
        proc.wait(timeout=timeout)
