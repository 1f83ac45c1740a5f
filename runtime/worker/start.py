"""Starting local worker processes from the runtime's own entry point, ``python -m runtime.worker``.

A worker never runs the user's main module: the job graph and its configuration reach it by
value (cloudpickle, :func:`runtime.cluster.master.serialize_graph` and
:func:`~runtime.cluster.master.serialize_config`), so a job written as a plain script (no
``if __name__ == "__main__":`` guard) runs as written, with its lambdas, nested functions
and classes defined in ``__main__``.

Two ways (``JobConfig.start_method``):

* ``"forkserver"`` (the default): one **fork server** per job-master process,
  ``python -m runtime.worker serve FD``, started on the first attempt with the runtime
  imported; it forks a worker per request, so a restart costs a fork, not an interpreter
  start. A request (:class:`ForkServer`) travels over a Unix socket with two descriptors:
  the worker's control connection and a **status socket** on which the server writes the
  worker's pid, and its exit code once it reaped it (the job master's sentinel, see
  :class:`ForkedWorker`). The server exits when its job-master process closes the socket;
* ``"spawn"``: a fresh interpreter per worker, ``python -m runtime.worker spawn FD``
  (:func:`spawn_worker`).

Either way the request (index, log level, job secret, the parent's ``sys.path`` and working
directory) travels over a socket, never in the process arguments, and the worker runs
:func:`runtime.worker.process.worker_main` on its control connection.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import pyarrow as pa

from runtime.errors import WorkerLostError
from runtime.worker.process import worker_main

_CODE = struct.Struct("q")
MAX_REQUEST_BYTES = 1 << 20
SERVER_REPLY_TIMEOUT_S = 60.0  # the first request waits for the server's imports
# what a worker's exit code reads when the fork server died before reporting it
UNKNOWN_EXIT = 255


def _python_command(*args: str) -> tuple[list[str], dict[str, str]]:
    """``python -m runtime.worker ARGS`` and its environment: the runtime importable from
    where this process imported it."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return [sys.executable, "-m", "runtime.worker", *args], env


def _request(index: int, log_level: int | None, secret: bytes) -> dict[str, Any]:
    return {"index": index, "log_level": log_level, "secret": secret, "sys_path": list(sys.path), "cwd": os.getcwd()}


def _run_worker(request: dict[str, Any], conn: Connection) -> None:
    """In the worker process: take the parent's import path and working directory, then run."""
    sys.path[:] = request["sys_path"]
    with contextlib.suppress(OSError):  # the directory may be gone: paths in the job are absolute then
        os.chdir(request["cwd"])
    worker_main(request["index"], conn, request["log_level"], request["secret"])


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


# -- the worker's side -----------------------------------------------------------------------------


def serve(fd: int) -> None:
    """The fork server's loop (``python -m runtime.worker serve FD``): fork a worker per
    request, report its pid and exit code on its status socket; return when the job master
    closes ``fd``."""
    _preload()
    listener = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the job master, which stops the job
    status: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(status)
        if listener not in ready:
            continue
        msg, fds, _flags, _addr = socket.recv_fds(listener, MAX_REQUEST_BYTES, 2)
        if not msg:
            return
        control_fd, status_fd = fds
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for s in (listener, *status.values()):
                    s.close()
                os.close(status_fd)
                os.close(wake_r)
                os.close(wake_w)
                _run_worker(pickle.loads(msg), Connection(control_fd))
            finally:
                os._exit(1)
        os.close(control_fd)
        st = socket.socket(fileno=status_fd)
        with contextlib.suppress(OSError):  # the job master gave up on it: reaped all the same
            st.sendall(_CODE.pack(pid))
        status[pid] = st
        _reap(status)


def _preload() -> None:
    """Load once, in the fork server, what every worker would otherwise load on its way to its
    first checkpoint: pyarrow's pandas layer (about 0.5 s, loaded by a process's first
    ``pa.array``). A forked worker inherits it, so a restarted worker's first checkpoint does
    not wait for it."""
    pa.array([0])


def _reap(status: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        st = status.pop(pid, None)
        if st is not None:
            with contextlib.suppress(OSError):
                st.sendall(_CODE.pack(os.waitstatus_to_exitcode(code)))
            st.close()


def spawn_main(fd: int) -> None:
    """A spawned worker (``python -m runtime.worker spawn FD``): its request comes first on
    the control connection."""
    conn = Connection(fd)
    request = conn.recv()
    _run_worker(request, conn)


# -- the job master's side -------------------------------------------------------------------------


class ForkedWorker:
    """A worker forked by the fork server: a :class:`runtime.cluster.launcher.WorkerHandle`
    whose ``sentinel`` (its status socket) is readable once the worker exited."""

    def __init__(self, pid: int, status: socket.socket) -> None:
        self.pid = pid
        self.sentinel = status
        self._exitcode: int | None = None

    def _poll(self, timeout: float | None) -> int | None:
        if self._exitcode is None and wait([self.sentinel], timeout):
            try:
                self._exitcode = _CODE.unpack(_recv_exactly(self.sentinel, _CODE.size))[0]
            except (OSError, EOFError):  # the fork server died before it reported
                self._exitcode = UNKNOWN_EXIT
        return self._exitcode

    @property
    def exitcode(self) -> int | None:
        return self._poll(0)

    def is_alive(self) -> bool:
        return self._poll(0) is None

    def kill(self) -> None:
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> None:
        self._poll(timeout)


class ForkServer:
    """The job-master process's fork server (see the module docstring), started on first use
    (again after it died, or in a forked child of this process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._owner = 0

    def _ensure_running(self) -> socket.socket:
        if self._sock is not None and self._owner == os.getpid() and self._proc is not None \
                and self._proc.poll() is None:  # fmt: skip
            return self._sock
        ours, theirs = socket.socketpair()
        cmd, env = _python_command("serve", str(theirs.fileno()))
        self._proc = subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._sock, self._owner = ours, os.getpid()
        return ours

    def start(self, index: int, log_level: int | None, secret: bytes) -> tuple[ForkedWorker, Connection]:
        """Fork worker ``index``; returns its handle and the job master's end of its control connection."""
        with self._lock:
            sock = self._ensure_running()
            ours, theirs = socket.socketpair()
            status, status_theirs = socket.socketpair()
            try:
                socket.send_fds(sock, [pickle.dumps(_request(index, log_level, secret))], [theirs.fileno(), status_theirs.fileno()])
            finally:
                theirs.close()
                status_theirs.close()
            status.settimeout(SERVER_REPLY_TIMEOUT_S)
            try:
                pid = _CODE.unpack(_recv_exactly(status, _CODE.size))[0]
            except (OSError, EOFError) as e:
                ours.close()
                status.close()
                raise WorkerLostError(f"the runtime's fork server did not start worker {index}: {e!r}") from None
            status.settimeout(None)
        return ForkedWorker(pid, status), Connection(ours.detach())


class SpawnedWorker:
    """A worker in its own interpreter: a :class:`runtime.cluster.launcher.WorkerHandle`
    whose ``sentinel`` (a pipe the worker holds open) is readable once it exited."""

    def __init__(self, proc: subprocess.Popen[bytes], sentinel: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.sentinel = sentinel

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.is_alive():
            self.proc.kill()

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.sentinel)


def spawn_worker(index: int, log_level: int | None, secret: bytes) -> tuple[SpawnedWorker, Connection]:
    """Start worker ``index`` in a fresh interpreter; returns its handle and the job master's
    end of its control connection."""
    ours, theirs = socket.socketpair()
    sentinel_r, sentinel_w = os.pipe()
    cmd, env = _python_command("spawn", str(theirs.fileno()))
    try:
        proc = subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(), sentinel_w), stdin=subprocess.DEVNULL)
    finally:
        theirs.close()
        os.close(sentinel_w)
    conn = Connection(ours.detach())
    conn.send(_request(index, log_level, secret))
    return SpawnedWorker(proc, sentinel_r), conn


def main(argv: list[str]) -> None:
    """``python -m runtime.worker serve FD`` or ``python -m runtime.worker spawn FD``."""
    if len(argv) != 2 or argv[0] not in ("serve", "spawn") or not argv[1].isdigit():
        sys.exit("usage: python -m runtime.worker {serve|spawn} FD (started by the runtime's job master)")
    (serve if argv[0] == "serve" else spawn_main)(int(argv[1]))
