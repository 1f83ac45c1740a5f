"""A materializer that may not write fails at once (issue 11, point 2): on a read-only
directory and with S3 credentials that may read and list but not write, taking the lease
fails naming the object and the permission, ``statelog materializer run ROOT --once`` exits
non-zero, and the daemon does not loop on it (it used to report "another daemon holds the
lease", exit 0, after ~42 s)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from materializer.daemon import MaterializerDaemon
from statelog import ValueStateDescriptor
from statelog.errors import StorePermissionError, TransientStoreError
from statelog.store import open_store
from statelog.store.faulty import FaultInjectingStore
from tests.s3server import S3Server
from tools.cli import main

PROJECT = Path(__file__).resolve().parents[2]
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
LEASE_OBJECT = "materializer/lease/gen-000000000001.json"


def make_job(url: str, options: dict | None = None) -> None:
    with statelog.open(url, store_options=options or {}) as job:
        b = job.backend("counter")
        for k in range(5):
            b.set_current_key(k)
            b.get_state(COUNT).update(k)
        job.checkpoint(sources={"events": 5})


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can read (pytest's tmp_path is private to its owner)."""
    d = Path(tempfile.mkdtemp(prefix="statelog-ro-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def readonly_prefix(root_dir: Path) -> list[str]:
    """A command prefix under which ``root_dir`` is read-only for the process.

    Not root: the directory tree is made read-only (EACCES). Root ignores file modes, so the
    command runs in a private mount namespace with ``root_dir`` bind-mounted read-only
    (EROFS; the rest of the system is untouched), or, without ``unshare``, as user nobody
    (EACCES) when that user can reach the project (a fresh clone in a private directory
    cannot be imported by nobody).
    """
    if os.geteuid() != 0:
        for p in [root_dir, *root_dir.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
        return []
    unshare = shutil.which("unshare")
    if unshare is not None:
        probe = subprocess.run([unshare, "-m", "true"], capture_output=True)
        if probe.returncode == 0:
            d = str(root_dir)
            script = f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" && exec "$@"'
            return [unshare, "-m", "sh", "-c", script, "sh"]
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        probe = subprocess.run([*prefix, sys.executable, "-c", "import tools.cli"], cwd=PROJECT,
                               capture_output=True, env={**os.environ, "PYTHONPATH": str(PROJECT)})  # fmt: skip
        if probe.returncode == 0:
            return prefix
    pytest.skip("running as root without unshare or a project user nobody can read: "
                "cannot make a directory read-only")  # fmt: skip


def test_run_once_on_a_read_only_directory_fails_at_once(shared_dir: Path) -> None:
    root = shared_dir / "root"
    make_job(root.as_uri())
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    cmd = [*readonly_prefix(root), sys.executable, "-m", "tools", "materializer", "run",
           root.as_uri(), "--once", "--lease-ttl", "30s"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)})  # fmt: skip
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr
    assert "permission denied" in err and "materializer/lease/" in err
    assert "write permission" in err and "Traceback" not in err
    assert "another daemon" not in err + proc.stdout
    assert elapsed < 20  # not a lease ttl of waiting
    assert not (root / "materializer").exists()


def test_local_store_names_the_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path.as_uri())

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("statelog.store.local.os.mkdir", refuse)
    with pytest.raises(StorePermissionError) as err:
        store.put_if_absent("a/b.json", b"x")
    assert "a/b.json" in str(err.value) and "write permission" in str(err.value)


def test_the_daemon_stops_on_a_permission_error_and_retries_transient_ones(tmp_path: Path) -> None:
    make_job(tmp_path.as_uri())
    store = FaultInjectingStore(open_store(tmp_path.as_uri()))
    denied = StorePermissionError(f"permission denied: write {LEASE_OBJECT}", key=LEASE_OBJECT)
    store.fail_next("put_if_absent", 1000, error=denied, key_prefix="materializer/lease/")
    daemon = MaterializerDaemon(store, interval_s=0.01, poll_s=0.01, lease_ttl_s=1.0, run_gc=False)
    result: list[BaseException] = []

    def run() -> None:
        try:
            daemon.run()
        except BaseException as exc:  # noqa: BLE001 - inspected below
            result.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        daemon.stop()
        t.join(10)
        pytest.fail("the daemon kept looping on a permission error")
    assert isinstance(result[0], StorePermissionError)

    # a transient failure of the lease write is retried: the daemon then materializes
    store.reset()
    store.fail_next("put_if_absent", 2, error=TransientStoreError, key_prefix="materializer/lease/")
    summary = MaterializerDaemon(store, interval_s=0.01, lease_ttl_s=1.0, run_gc=False).run(once=True)
    assert summary is not None and summary["leader"] and summary["action"] == "materialized"


@pytest.mark.s3
def test_run_once_with_read_only_s3_credentials_fails_at_once(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{s3_server.bucket}/ro-{os.getpid()}-{time.monotonic_ns()}"
    make_job(url, s3_server.options())
    ro = s3_server.readonly_options()
    monkeypatch.setenv("AWS_ENDPOINT_URL", ro["endpoint"])
    monkeypatch.setenv("AWS_REGION", ro["region"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ro["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ro["secret_key"])
    t0 = time.monotonic()
    code = main(["materializer", "run", url, "--once", "--lease-ttl", "30s"])
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "permission denied" in err and LEASE_OBJECT in err and "s3:PutObject" in err
    assert ro["secret_key"] not in err + out
    assert elapsed < 20
    with open_store(url, s3_server.options()) as store:
        assert list(store.list("materializer/")) == []
