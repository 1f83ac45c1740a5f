"""Operations that the credentials (or a read-only directory) do not allow fail at once, with
one line naming the object and the missing permission:

* a materializer that may not write: on a read-only directory and with S3 credentials that
  may read and list but not write, taking the lease fails, ``statelog materializer run ROOT
  --once`` exits 2, and the daemon does not loop on it;
* ``statelog gc`` with credentials that may not delete stops at the first denied delete
  (exit 2, one line; nothing deleted after it);
* ``statelog restore`` with credentials that may not write fails before it starts Spark.
"""

from __future__ import annotations

import contextlib
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
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.daemon.loop import MaterializerDaemon
from materializer.gc.collect import collect_garbage
from statelog import ValueStateDescriptor
from statelog.errors import StatelogError, StorePermissionError, TransientStoreError
from statelog.layout import checkpoint_key
from statelog.store import open_store
from statelog.testing import OUTAGES, FaultInjectingStore
from tests.support.s3server import S3Server
from tools.cli import main

PROJECT = Path(__file__).resolve().parents[2]
COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
LEASE_OBJECT = "materializer/lease/gen-000000000001.json"


def make_job(url: str, options: dict | None = None, checkpoints: int = 1) -> None:
    with statelog.open(url, store_options=options or {}) as job:
        b = job.backend("counter")
        for n in range(checkpoints):
            for k in range(5):
                b.set_current_key(k)
                b.get_state(COUNT).update(k + n)
            job.checkpoint(sources={"events": 5 * (n + 1)})


def use_credentials(monkeypatch: pytest.MonkeyPatch, options: dict) -> None:
    """The CLI's S3 endpoint and credentials from the environment, as a user sets them."""
    for var, opt in (("AWS_ENDPOINT_URL", "endpoint"), ("AWS_REGION", "region"),
                     ("AWS_ACCESS_KEY_ID", "access_key"), ("AWS_SECRET_ACCESS_KEY", "secret_key")):
        monkeypatch.setenv(var, options[opt])


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
           root.as_uri(), "--once", "--lease-ttl", "300s"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)})  # fmt: skip
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr
    assert "permission denied" in err and "materializer/lease/" in err
    assert "write permission" in err and "Traceback" not in err
    assert "another daemon" not in err + proc.stdout
    assert elapsed < 100  # generous (a process start on a loaded machine), yet far below the 300 s ttl
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
    code = main(["materializer", "run", url, "--once", "--lease-ttl", "300s"])
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "permission denied" in err and LEASE_OBJECT in err and "s3:PutObject" in err
    assert ro["secret_key"] not in err + out
    assert elapsed < 100  # generous, yet far below the 300 s ttl: no wait for a lease
    with open_store(url, s3_server.options()) as store:
        assert list(store.list("materializer/")) == []



# -- gc: the first delete the store refuses ends the run --------------------------------------


def add_garbage(url: str, options: dict | None = None, n: int = 3) -> list[str]:
    """Objects below ``changelog/`` that no checkpoint references (GC deletes them at grace 0)."""
    keys = [f"changelog/stray-{i}.bin" for i in range(n)]
    with open_store(url, options or {}) as store:
        for key in keys:
            store.put(key, b"garbage")
    return keys


def test_gc_stops_at_the_first_denied_delete(tmp_path: Path) -> None:
    make_job(tmp_path.as_uri())
    first, denied, last = add_garbage(tmp_path.as_uri())
    store = FaultInjectingStore(open_store(tmp_path.as_uri()))
    store.fail_next("delete", 1, error=OUTAGES["permission"], key_prefix=denied)
    with pytest.raises(StorePermissionError) as err:
        collect_garbage(store, grace_s=0, now=time.time() + 3600)
    assert err.value.key == denied
    message = str(err.value)
    assert message.startswith("GC stopped at the first delete the store refused (1 object(s) deleted before it")
    assert f"delete of {denied}" in message
    assert store.head(first) is None  # deleted before the denied one
    assert store.head(denied) is not None and store.head(last) is not None  # nothing after it


@pytest.mark.s3
@pytest.mark.parametrize("retain", [None, "1"])
def test_gc_without_delete_permission_is_one_line(
    s3_server: S3Server, retain: str | None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"s3://{s3_server.bucket}/nodelete-{os.getpid()}-{time.monotonic_ns()}"
    make_job(url, s3_server.options(), checkpoints=2)
    garbage = add_garbage(url, s3_server.options())
    with open_store(url, s3_server.options()) as store:
        before = {o.key for o in store.list("")}
    nd = s3_server.nodelete_options()
    use_credentials(monkeypatch, nd)
    code = main(["gc", url, "--grace", "0", *(["--retain", retain] if retain else [])])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statelog: error: GC stopped at the first delete"), err
    first = checkpoint_key(1) if retain else garbage[0]  # retention deletes checkpoint metadata first
    assert f"denied delete of {url}/{first} " in lines[0] and "s3:DeleteObject" in lines[0]
    assert "grant it, or use credentials that have it" in lines[0]
    assert nd["secret_key"] not in err and s3_server.secret_key not in err
    with open_store(url, s3_server.options()) as store:
        assert {o.key for o in store.list("")} == before


# -- restore: the savepoint must be writable before Spark starts ------------------------------


def refuse_spark(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Record every SparkSession ``statelog restore`` starts (and refuse to start it)."""
    pytest.importorskip("pyspark")
    import tools.cli.spark_session

    started: list[str | None] = []

    @contextlib.contextmanager
    def no_spark(master: str | None, verbose: int = 0) -> Iterator[Any]:
        started.append(master)
        raise StatelogError("the test does not start Spark")
        yield  # a generator function, as the context manager it replaces

    monkeypatch.setattr(tools.cli.spark_session, "session", no_spark)
    return started


@pytest.mark.s3
def test_restore_with_read_only_credentials_fails_before_spark(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{s3_server.bucket}/ro-restore-{os.getpid()}-{time.monotonic_ns()}"
    make_job(url, s3_server.options())
    started = refuse_spark(monkeypatch)
    ro = s3_server.readonly_options()
    use_credentials(monkeypatch, ro)
    code = main(["restore", url, "--checkpoint", "latest", "--parallelism", "2", "--savepoint", "p2"])
    out, err = capsys.readouterr()
    assert started == []  # the Spark job never started
    assert code == 2 and out == "", (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statelog: error: cannot write savepoint 'p2'"), err
    assert f"{url}/savepoints/p2/write-check-" in lines[0] and "s3:PutObject" in lines[0]
    assert ro["secret_key"] not in err
    with open_store(url, s3_server.options()) as store:
        assert list(store.list("savepoints/")) == []


@pytest.mark.s3
def test_restore_write_check_without_delete_permission_goes_on(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"s3://{s3_server.bucket}/nd-restore-{os.getpid()}-{time.monotonic_ns()}"
    make_job(url, s3_server.options())
    started = refuse_spark(monkeypatch)
    use_credentials(monkeypatch, s3_server.nodelete_options())
    main(["restore", url, "--checkpoint", "latest", "--savepoint", "nd"])
    out, err = capsys.readouterr()
    assert started == [None]  # the restore went on to start Spark
    warning = next(ln for ln in err.splitlines() if "WARNING" in ln)
    with open_store(url, s3_server.options()) as store:
        (probe,) = [o.key for o in store.list("savepoints/")]
    assert probe.startswith("savepoints/nd/write-check-")
    assert f"the write check object {probe} was written but cannot be deleted" in warning
    assert "s3:DeleteObject" in warning and "statelog savepoint delete ROOT nd" in warning


def test_restore_write_check_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    make_job(tmp_path.as_uri())
    started = refuse_spark(monkeypatch)
    code = main(["restore", tmp_path.as_uri(), "--checkpoint", "latest", "--savepoint", "ok"])
    assert started == [None] and code == 2  # the Spark stand-in refused to start
    assert "the test does not start Spark" in capsys.readouterr().err
    with open_store(tmp_path.as_uri()) as store:
        assert list(store.list("savepoints/")) == []
