"""open_store URL/option parsing, key validation, and the ObjectStore contract on both stores."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from statelog.errors import ConfigError, ObjectExistsError, ObjectNotFoundError
from statelog.store import (
    ObjectInfo,
    ObjectStore,
    RetryPolicy,
    open_store,
    redact_url,
    validate_key,
    validate_prefix,
)
from statelog.store.local import LocalObjectStore
from statelog.store.s3.config import S3Config
from statelog.store.s3.object_store import S3ObjectStore
from tests.support.s3server import RootSpec

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"

# -- URL parsing ----------------------------------------------------------------------------


def test_file_url_opens_local_store(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    assert isinstance(store, LocalObjectStore)
    assert store.url == tmp_path.as_uri()
    assert store.root == tmp_path


def test_bare_absolute_path_and_localhost_and_quoting(tmp_path: Path) -> None:
    assert open_store(str(tmp_path)).url == tmp_path.as_uri()
    assert open_store(f"file://localhost{tmp_path}").url == tmp_path.as_uri()
    spaced = tmp_path / "with space"
    assert open_store(spaced.as_uri()).root == spaced  # type: ignore[attr-defined]
    assert open_store(f"{tmp_path}/a/../b").root == tmp_path / "b"  # type: ignore[attr-defined]


def test_s3_url_parses_bucket_and_prefix_without_network() -> None:
    opts = {"endpoint": "http://127.0.0.1:1", "access_key": "AKIAXXXX", "secret_key": SECRET}
    store = open_store("s3://my-bucket/jobs/job-1/", opts)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.url) == (
        "my-bucket",
        "jobs/job-1",
        "s3://my-bucket/jobs/job-1",
    )
    bare = open_store("s3://my-bucket", opts)
    assert (bare.prefix, bare.url) == ("", "s3://my-bucket")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("", "non-empty"),
        ("relative/dir", "file://"),
        ("./x", "absolute path"),
        ("file://relative/x", "three slashes"),
        ("file:relative", "neither a URL nor an absolute path"),
        ("ftp://host/x", "unsupported job root scheme 'ftp'"),
        ("gs://bucket/x", "expected file:///absolute/path"),
        ("s3://", "names no bucket"),
        ("s3:///prefix", "names no bucket"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("s3://ab/x", "not a valid S3 bucket name"),
        ("s3://bucket:9000/x", "endpoint"),
        ("s3://bucket/a//b", "empty segment"),
        ("s3://bucket/a/../b", "'..' segment"),
        ("file:///tmp/x?mode=1", "query"),
    ],
)
def test_malformed_urls_raise_config_error(url: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        open_store(url)
    assert expected in str(info.value)


def test_credentials_in_url_are_refused_without_echoing_the_secret() -> None:
    url = f"s3://AKIAEXAMPLE:{SECRET}@bucket/prefix"
    with pytest.raises(ConfigError) as info:
        open_store(url)
    message = str(info.value)
    assert SECRET not in message and "AKIAEXAMPLE" not in message
    assert "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in message
    assert "s3://***@bucket/prefix" in message


def test_query_string_is_refused_and_redacted() -> None:
    with pytest.raises(ConfigError) as info:
        open_store(f"s3://bucket/p?secret={SECRET}")
    assert SECRET not in str(info.value)
    assert "options mapping" in str(info.value)


def test_file_root_takes_no_options(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file job root takes no options, got endpoint"):
        open_store(tmp_path.as_uri(), {"endpoint": "x"})


def test_file_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"")
    with pytest.raises(ConfigError, match="not a directory"):
        open_store(str(target))


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        (f"s3://AKIA:{SECRET}@bucket/p", "s3://***@bucket/p"),
        (f"s3://bucket/p?token={SECRET}", "s3://bucket/p?***"),
        ("s3://bucket/p", "s3://bucket/p"),
        ("file:///tmp/x", "file:///tmp/x"),
        (f"/tmp/x?{SECRET}", "/tmp/x?***"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


# -- S3 options -----------------------------------------------------------------------------


def test_unknown_s3_option_lists_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        open_store("s3://bucket/p", {"endpiont": "x"})
    assert "endpiont" in str(info.value)
    assert "valid options are endpoint, secure, region, access_key" in str(info.value)


def test_s3_config_from_environment() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://ignored:1",
        "AWS_ENDPOINT_URL_S3": "http://minio.local:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIAENV",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "tok",
    }
    cfg = S3Config.from_options({}, environ=env)
    assert (cfg.endpoint, cfg.secure, cfg.region) == ("minio.local:9000", False, "eu-west-1")
    assert (cfg.access_key, cfg.secret_key, cfg.session_token) == ("AKIAENV", SECRET, "tok")
    assert SECRET not in repr(cfg) and "tok" not in repr(cfg)
    assert "AKIA…" in repr(cfg)


def test_s3_config_defaults_and_option_precedence() -> None:
    cfg = S3Config.from_options({}, environ={})
    assert (cfg.endpoint, cfg.secure, cfg.region, cfg.access_key) == (
        "s3.amazonaws.com",
        True,
        "us-east-1",
        None,
    )
    assert (cfg.connect_timeout, cfg.read_timeout, cfg.retry) == (5.0, 30.0, RetryPolicy())
    env = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "envsecret", "AWS_REGION": "x"}
    cfg = S3Config.from_options(
        {
            "endpoint": "host:9000",
            "secure": "false",
            "region": "r1",
            "access_key": "OPTKEY",
            "secret_key": "optsecret",
            "connect_timeout": 1,
            "read_timeout": "2.5",
            "retry": {"max_attempts": 2},
        },
        environ=env,
    )
    assert (cfg.endpoint, cfg.secure, cfg.region) == ("host:9000", False, "r1")
    assert (cfg.access_key, cfg.secret_key) == ("OPTKEY", "optsecret")
    assert (cfg.connect_timeout, cfg.read_timeout, cfg.retry.max_attempts) == (1.0, 2.5, 2)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"endpoint": "https://h:1", "secure": False}, "contradicts the endpoint scheme"),
        ({"endpoint": "ftp://h:1"}, "expected http:// or https://"),
        ({"endpoint": "http://h:1/path"}, "without path"),
        ({"endpoint": "http://user:pw@h:1"}, "credentials"),
        ({"endpoint": "h:1/x"}, "malformed"),
        ({"secure": "maybe"}, "must be a bool"),
        ({"connect_timeout": 0}, "seconds > 0"),
        ({"read_timeout": "soon"}, "seconds > 0"),
        ({"access_key": "AKIAONLY"}, "lack the secret key"),
        ({"secret_key": SECRET}, "lack the access key"),
        ({"retry": {"max_attempts": 0}}, "max_attempts"),
        ({"region": 5}, "must be a str"),
    ],
)
def test_bad_s3_options(options: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        S3Config.from_options(options, environ={})
    assert expected in str(info.value)
    assert SECRET not in str(info.value)


# -- key validation -------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "a/b/c.seg", "x-1/y_2/Z 3", "ünï/cödé"])
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("", "empty"),
        ("/a", "starts with '/'"),
        ("a//b", "empty segment"),
        ("a/", "empty segment"),
        ("a/../b", "'..' segment"),
        ("./a", "'.' segment"),
        ("a\x00b", "NUL"),
        (3, "must be a str"),
    ],
)
def test_invalid_keys(key: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_key(key)  # type: ignore[arg-type]
    assert expected in str(info.value)


def test_prefix_validation() -> None:
    assert validate_prefix("") == ""
    assert validate_prefix("a/") == "a/"
    assert validate_prefix("a/b") == "a/b"
    for bad in ("/", "/a", "a//", "../"):
        with pytest.raises(ConfigError):
            validate_prefix(bad)


# -- the ObjectStore contract, on the local filesystem and on SeaweedFS -----------------------


@pytest.fixture
def store(store_root: RootSpec) -> Iterator[ObjectStore]:
    with store_root.open() as s:
        yield s


def test_put_get_roundtrip_and_url(store: ObjectStore, store_root: RootSpec) -> None:
    store.put("a/b/c.bin", b"\x00\x01payload")
    assert store.get("a/b/c.bin") == b"\x00\x01payload"
    assert store.url == store_root.url.rstrip("/")


def test_put_is_write_once(store: ObjectStore) -> None:
    store.put("obj", b"first")
    store.put("obj", b"first")  # identical: idempotent no-op
    store.put("obj", bytearray(b"first"))
    for other in (b"firsT", b"other bytes", b""):
        with pytest.raises(ObjectExistsError) as info:
            store.put("obj", other)
        assert info.value.key == "obj"
        assert "'obj' already exists" in str(info.value) and "write-once" in str(info.value)
    assert store.get("obj") == b"first"


def test_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.get_range("empty", 0, 10) == b""
    assert store.get_range("empty", -4, 4) == b""
    assert store.head("empty") == ObjectInfo("empty", 0, store.head("empty").mtime)  # type: ignore[union-attr]


def test_missing_object(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError) as info:
        store.get("no/such/key")
    assert info.value.key == "no/such/key" and "'no/such/key' not found" in str(info.value)
    with pytest.raises(ObjectNotFoundError):
        store.get_range("no/such/key", 0, 4)
    with pytest.raises(ObjectNotFoundError):
        store.get_range("no/such/key", -4, 2)
    with pytest.raises(ObjectNotFoundError):
        store.get_range("no/such/key", 0, 0)
    assert store.head("no/such/key") is None
    assert not store.exists("no/such/key")
    store.delete("no/such/key")  # deleting a missing object is fine


def test_get_range(store: ObjectStore) -> None:
    data = bytes(range(100))
    store.put("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 95, 10) == data[95:]  # short only at the end
    assert store.get_range("r", 100, 5) == b""
    assert store.get_range("r", 500, 5) == b""
    assert store.get_range("r", 10, 0) == b""
    assert store.get_range("r", -8, 8) == data[-8:]  # footer read
    assert store.get_range("r", -8, 3) == data[-8:-5]
    assert store.get_range("r", -8, 50) == data[-8:]
    assert store.get_range("r", -500, 4) == data[:4]  # clamps at the start
    assert store.get_range("r", -500, 500) == data


@pytest.mark.parametrize(("offset", "length"), [(0, -1), (1.5, 2), (0, "3"), (True, 1)])
def test_get_range_validates_arguments(store: ObjectStore, offset: object, length: object) -> None:
    store.put("r", b"abc")
    with pytest.raises(ConfigError):
        store.get_range("r", offset, length)  # type: ignore[arg-type]


def test_head_and_exists(store: ObjectStore) -> None:
    store.put("h/x", b"12345")
    info = store.head("h/x")
    assert info is not None and (info.key, info.size) == ("h/x", 5)
    assert info.mtime > 1_600_000_000
    assert store.exists("h/x")
    assert store.head("h") is None  # a prefix is not an object


def test_list_is_in_key_order_and_filters_by_prefix(store: ObjectStore) -> None:
    keys = ["a/b", "a-c", "a/a/z", "b", "a/b2/x", "ab", "c/d/e/f"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * i)
    listed = list(store.list())
    assert [i.key for i in listed] == sorted(keys)
    assert {i.key: i.size for i in listed} == {k: i for i, k in enumerate(keys)}
    assert [i.key for i in store.list("a/")] == ["a/a/z", "a/b", "a/b2/x"]
    assert [i.key for i in store.list("a/b")] == ["a/b", "a/b2/x"]
    assert [i.key for i in store.list("a")] == ["a-c", "a/a/z", "a/b", "a/b2/x", "ab"]
    assert list(store.list("zzz")) == []
    assert list(store.list("nope/")) == []


def test_list_of_fresh_root_is_empty(store: ObjectStore) -> None:
    assert list(store.list()) == []


def test_delete(store: ObjectStore) -> None:
    store.put("d/1", b"1")
    store.put("d/2", b"2")
    store.delete("d/1")
    assert store.head("d/1") is None
    assert [i.key for i in store.list()] == ["d/2"]
    store.delete("d/1")
    store.put("d/1", b"new content after delete")  # a deleted key may be written again
    assert store.get("d/1") == b"new content after delete"


def test_invalid_keys_are_refused_by_every_operation(store: ObjectStore) -> None:
    for call in (
        lambda: store.put("../x", b""),
        lambda: store.get("/abs"),
        lambda: store.get_range("a//b", 0, 1),
        lambda: store.head(""),
        lambda: store.delete("a/./b"),
        lambda: list(store.list("/")),
    ):
        with pytest.raises(ConfigError):
            call()


def test_concurrent_puts_of_one_key(store: ObjectStore) -> None:
    errors: list[BaseException] = []

    def put(data: bytes) -> None:
        try:
            store.put("race", data)
        except BaseException as exc:  # collected and checked below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(b"same",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.get("race") == b"same"
