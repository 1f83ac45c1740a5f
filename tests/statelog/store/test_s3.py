"""S3ObjectStore against the real SeaweedFS server, plus error mapping against tiny fake servers."""

from __future__ import annotations

import io
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from statelog.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ObjectExistsError,
    StoreError,
    TransientStoreError,
)
from statelog.store import RetryPolicy, open_store
from statelog.store.s3.object_store import S3ObjectStore
from tests.support.s3server import RootSpec, S3Server

FAST_RETRY = {"max_attempts": 3, "base_delay": 0.01, "max_delay": 0.02}
WRONG_SECRET = "not-the-secret-0123456789-abcdefghij"


def no_secret_anywhere(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


# -- against SeaweedFS -------------------------------------------------------------------------


@pytest.mark.s3
def test_objects_live_under_the_prefix(s3_server: S3Server, s3_root: RootSpec) -> None:
    store = s3_root.open()
    store.put("changelog/1.seg", b"abc")
    prefix = s3_root.url.removeprefix(f"s3://{s3_server.bucket}/")
    raw = s3_server.raw_client()
    resp = raw.get_object(s3_server.bucket, f"{prefix}/changelog/1.seg")
    try:
        assert resp.read() == b"abc"
    finally:
        resp.close()
        resp.release_conn()
    # A sibling root whose name extends this prefix is not listed.
    raw.put_object(s3_server.bucket, f"{prefix}x/other", io.BytesIO(b"z"), 1)
    assert [i.key for i in store.list()] == ["changelog/1.seg"]


@pytest.mark.s3
def test_roots_are_isolated(s3_server: S3Server) -> None:
    a, b = s3_server.unique_root().open(), s3_server.unique_root().open()
    a.put("k", b"from a")
    assert b.head("k") is None
    b.put("k", b"from b")  # no conflict across roots
    assert a.get("k") == b"from a"


@pytest.mark.s3
def test_write_once_with_same_size_different_bytes(s3_root: RootSpec) -> None:
    store = s3_root.open()
    store.put("k", b"aaaa")
    with pytest.raises(ObjectExistsError, match="4 bytes stored, 4 bytes given"):
        store.put("k", b"aaab")


@pytest.mark.s3
def test_large_object_single_put_and_ranges(s3_root: RootSpec) -> None:
    store = s3_root.open()
    data = os.urandom(6 * 1024 * 1024 + 3)
    store.put("big", data)
    assert store.get("big") == data
    assert store.get_range("big", 5 * 1024 * 1024, 100) == data[5 * 1024 * 1024 :][:100]
    assert store.get_range("big", -16, 16) == data[-16:]
    store.put("big", data)  # identical retry compares content


@pytest.mark.s3
def test_check_passes_with_good_credentials(s3_root: RootSpec) -> None:
    store = s3_root.open()
    assert isinstance(store, S3ObjectStore)
    store.check()


@pytest.mark.s3
@pytest.mark.parametrize("which", ["secret", "access_key"])
def test_wrong_credentials_are_refused(
    s3_server: S3Server, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    if which == "secret":
        opts = s3_server.options(secret_key=WRONG_SECRET)
    else:
        opts = s3_server.options(access_key="AKIAUNKNOWNKEY123", secret_key=WRONG_SECRET)
    store = open_store(f"s3://{s3_server.bucket}/wrong-creds", opts)
    with caplog.at_level(logging.DEBUG):
        for call in (lambda: store.put("k", b"x"), lambda: store.get("k"), store.check):
            with pytest.raises(AuthenticationError) as info:
                call()
            message = str(info.value)
            assert "refused the credentials for access key" in message
            assert "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in message
            assert str(opts["access_key"])[:4] + "…" in message
            assert str(opts["access_key"]) not in message  # first four characters only
            no_secret_anywhere(WRONG_SECRET, message, repr(info.value))
            no_secret_anywhere(s3_server.secret_key, message)
    config = repr(store.config)  # type: ignore[attr-defined]
    no_secret_anywhere(WRONG_SECRET, repr(store), store.url, config, caplog.text)


@pytest.mark.s3
def test_anonymous_access_is_refused(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    store = open_store(
        f"s3://{s3_server.bucket}/anon", {"endpoint": s3_server.endpoint, "region": "us-east-1"}
    )
    with pytest.raises(AuthenticationError, match="anonymous request"):
        store.get("k")


@pytest.mark.s3
def test_missing_bucket(s3_server: S3Server) -> None:
    store = open_store("s3://no-such-bucket-statelog/p", s3_server.options())
    with pytest.raises(BucketNotFoundError) as info:
        store.put("k", b"x")
    assert "bucket 'no-such-bucket-statelog' does not exist" in str(info.value)
    assert "create it" in str(info.value)
    with pytest.raises(BucketNotFoundError):
        list(store.list())


@pytest.mark.s3
def test_secret_never_in_repr_url_or_logs(
    s3_server: S3Server, s3_root: RootSpec, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        store = s3_root.open()
        store.put("k", b"v")
        store.get("k")
        store.close()
    config = repr(store.config)  # type: ignore[attr-defined]
    no_secret_anywhere(s3_server.secret_key, repr(store), store.url, config, caplog.text)


# -- unreachable and misbehaving servers ---------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_gives_transient_error_quickly() -> None:
    opts = {
        "endpoint": f"http://127.0.0.1:{closed_port()}",
        "access_key": "AKIAEXAMPLE",
        "secret_key": WRONG_SECRET,
        "retry": FAST_RETRY,
        "connect_timeout": 1,
    }
    store = open_store("s3://some-bucket/p", opts)
    started = time.monotonic()
    with pytest.raises(TransientStoreError) as info:
        store.get("k")
    assert time.monotonic() - started < 30.0  # the fast retry policy, not the default one
    assert "failed after 3 attempt(s)" in str(info.value)
    assert "cannot reach http://127.0.0.1:" in str(info.value)
    no_secret_anywhere(WRONG_SECRET, str(info.value))


def test_read_timeout_is_transient() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts connections (kernel backlog) but never answers
        port = listener.getsockname()[1]
        store = open_store(
            "s3://bucket/p",
            {
                "endpoint": f"http://127.0.0.1:{port}",
                "access_key": "AKIAEXAMPLE",
                "secret_key": WRONG_SECRET,
                "read_timeout": 0.2,
                "retry": {"max_attempts": 2, "base_delay": 0.01, "max_delay": 0.01},
            },
        )
        with pytest.raises(TransientStoreError, match="after 2 attempt.*ReadTimeoutError"):
            store.head("k")


Script = Callable[[str, str], tuple[int, bytes]]


@contextmanager
def fake_s3(script: Script) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A tiny HTTP server answering every request with ``script(method, path)``."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path.split("?", 1)[0]))
            status, body = script(self.command, self.path.split("?", 1)[0])
            self.send_response(status)
            if body:
                self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_HEAD = do_DELETE = handle_one

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def xml_error(code: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>{code} message</Message><Resource>/bkt/p/k</Resource>"
        "<RequestId>1</RequestId></Error>"
    ).encode()


def fake_store(endpoint: str) -> S3ObjectStore:
    opts = {
        "endpoint": endpoint,
        "access_key": "AKIAEXAMPLE",
        "secret_key": WRONG_SECRET,
        "retry": RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002),
    }
    store = open_store("s3://bkt/p", opts)
    assert isinstance(store, S3ObjectStore)
    return store


def bucket_ok(then: Script) -> Script:
    def script(method: str, path: str) -> tuple[int, bytes]:
        if method == "HEAD" and path == "/bkt":
            return 200, b""
        return then(method, path)

    return script


def test_slowdown_is_retried_until_success() -> None:
    answers = iter([(503, xml_error("SlowDown")), (500, xml_error("InternalError"))])
    with fake_s3(bucket_ok(lambda m, p: next(answers, (200, b"payload")))) as (url, seen):
        assert fake_store(url).get("k") == b"payload"
    assert seen == [("HEAD", "/bkt")] + [("GET", "/bkt/p/k")] * 3


def test_persistent_5xx_gives_up_after_max_attempts() -> None:
    with (
        fake_s3(lambda m, p: (503, b"")) as (url, seen),
        pytest.raises(TransientStoreError, match="check s3://bkt/p failed after 4 attempt"),
    ):
        fake_store(url).get("k")
    assert seen == [("HEAD", "/bkt")] * 4


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (403, "InvalidAccessKeyId", AuthenticationError),
        (403, "SignatureDoesNotMatch", AuthenticationError),
        (400, "InvalidArgument", StoreError),
        (404, "NoSuchBucket", BucketNotFoundError),
    ],
)
def test_final_errors_are_not_retried(status: int, code: str, error: type[Exception]) -> None:
    with (
        fake_s3(bucket_ok(lambda m, p: (status, xml_error(code)))) as (url, seen),
        pytest.raises(error) as info,
    ):
        fake_store(url).get("k")
    assert not isinstance(info.value, TransientStoreError)
    assert seen == [("HEAD", "/bkt"), ("GET", "/bkt/p/k")]
    no_secret_anywhere(WRONG_SECRET, str(info.value))


def test_missing_bucket_on_check() -> None:
    with (
        fake_s3(lambda m, p: (404, b"")) as (url, _),
        pytest.raises(BucketNotFoundError, match="'bkt' does not exist"),
    ):
        fake_store(url).head("k")


def test_non_xml_5xx_from_a_proxy_is_transient() -> None:
    def script(method: str, path: str) -> tuple[int, bytes]:
        return (200, b"") if method == "HEAD" else (502, b"")

    with (
        fake_s3(script) as (url, seen),
        pytest.raises(TransientStoreError, match="after 4 attempt"),
    ):
        fake_store(url).get("k")
    assert len(seen) == 5
