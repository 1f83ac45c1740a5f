"""No rendering of any object that holds store options or credentials contains a secret.

Every object is built with a known secret (the SeaweedFS server's real secret key, or a wrong
one where the call must fail) and rendered every way it can reach a user: ``repr``, ``str``,
``format``, the messages of the exceptions it raises (wrong credentials and an unreachable
endpoint against the real server, malformed options), logging captured at DEBUG, and where an
object is pickled to another process, the unpickled copy's renderings.
"""

from __future__ import annotations

import logging
import pickle
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import statelog
from statelog.errors import StatelogError
from statelog.store import open_store
from statelog.store.options import REDACTED, StoreOptions, is_secret, redact, resolve_store_options
from statelog.store.s3.config import S3Config
from statelog.testing import FaultInjectingStore
from tests.support.s3server import S3Server

WRONG_SECRET = "wrong-secret-0123456789-abcdefghijklmnop"
TOKEN = "session-token-5f3c2a1b9e8d7c6b5a4f3e2d1c0b"
FAST = {"max_attempts": 1}


def renderings(obj: Any) -> list[str]:
    out = [repr(obj), str(obj), f"{obj}", f"{obj!r}", "%s %r" % (obj, obj)]  # noqa: UP031 - %-formatting is what logging does
    try:
        copy = pickle.loads(pickle.dumps(obj))
    except (TypeError, pickle.PicklingError, AttributeError):
        return out
    return [*out, repr(copy), str(copy)]


def exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def assert_hidden(secrets: list[str], what: str, texts: list[str]) -> None:
    for secret in secrets:
        for text in texts:
            assert secret not in text, f"{what} shows a secret: {text[:300]}"


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# -- the helper ----------------------------------------------------------------------------------


def test_secret_names() -> None:
    for name in ("access_key", "secret_key", "session_token", "AWS_SECRET_ACCESS_KEY", "aws_access_key_id",
                 "AWS_SESSION_TOKEN", "password", "db_password", "credentials_file", "api-token", "store.secret_key"):
        assert is_secret(name), name
    for name in ("endpoint", "region", "secure", "connect_timeout", "read_timeout", "retry"):
        assert not is_secret(name), name


def test_store_options_hide_secrets_but_keep_them_for_open_store() -> None:
    raw = {"endpoint": "http://127.0.0.1:1", "access_key": "AKIAEXAMPLE123456", "secret_key": WRONG_SECRET,
           "session_token": TOKEN, "retry": {"max_attempts": 2}}
    opts = StoreOptions(raw)
    assert_hidden(["AKIAEXAMPLE123456", WRONG_SECRET, TOKEN], "StoreOptions", renderings(opts))
    assert REDACTED in repr(opts) and "127.0.0.1:1" in repr(opts)
    assert opts == raw and dict(opts) == raw and opts["secret_key"] == WRONG_SECRET
    assert pickle.loads(pickle.dumps(opts)) == raw
    assert redact(raw)["secret_key"] == REDACTED and redact(raw)["retry"] == {"max_attempts": 2}
    with pytest.raises(AttributeError):
        opts._items = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts["secret_key"] = "x"  # type: ignore[index]


def test_resolved_options_carry_the_environment_without_showing_it() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIAENV1234",
           "AWS_SECRET_ACCESS_KEY": WRONG_SECRET, "AWS_SESSION_TOKEN": TOKEN}
    opts = resolve_store_options("s3://bucket/prefix", {"read_timeout": 3}, env)
    assert dict(opts) == {"endpoint": "http://127.0.0.1:9", "region": "eu-west-1", "access_key": "AKIAENV1234",
                          "secret_key": WRONG_SECRET, "session_token": TOKEN, "read_timeout": 3}
    # a process without that environment opens the same store
    assert S3Config.from_options(opts, {}) == S3Config.from_options({"read_timeout": 3}, env)
    assert_hidden([WRONG_SECRET, TOKEN], "resolved options", renderings(opts))
    assert resolve_store_options("file:///tmp/x", None) == {}


# -- stores, jobs, the materializer, the runtime -------------------------------------------------


@pytest.mark.s3
def test_stores_jobs_and_daemons_on_s3_never_render_the_secret(s3_server: S3Server,
                                                               debug_logs: pytest.LogCaptureFixture) -> None:
    from materializer.background import start_background
    from materializer.daemon.loop import MaterializerDaemon

    secret = s3_server.secret_key
    root = f"s3://{s3_server.bucket}/secrets-{uuid.uuid4().hex}"
    options = StoreOptions(s3_server.options())
    texts: list[str] = []
    store = open_store(root, options)
    texts += renderings(store) + renderings(store.config) + [store.url]
    texts += renderings(FaultInjectingStore(store))
    job = statelog.open(root, store_options=options)
    try:
        b = job.backend("op")
        count = b.get_state(statelog.ValueStateDescriptor("count", pa.int64(), default=0))
        b.set_current_key("k")
        count.update(1)
        job.checkpoint(sources={"s": 1})
        texts += renderings(job)
        daemon = MaterializerDaemon(open_store(root, options), owner="secrets-test")
        texts += renderings(daemon)
        daemon.store.close()
        with start_background(root, store_options=options, interval_s=3600) as bg:
            texts += renderings(bg) + renderings(bg.daemon)
    finally:
        job.close()
        store.close()
    assert_hidden([secret], "a store, job or daemon", texts)
    assert_hidden([secret], "the DEBUG log", [debug_logs.text])


def test_runtime_job_config_never_renders_the_secret(tmp_path: Any) -> None:
    from runtime import StreamExecutionEnvironment

    options = {"endpoint": "http://127.0.0.1:1", "access_key": "AKIAEXAMPLE123456", "secret_key": WRONG_SECRET,
               "session_token": TOKEN}
    env = StreamExecutionEnvironment(state_root="s3://bucket/job", store_options=options)
    cfg = env.config
    assert cfg.store_options == options  # the workers still get them (JobConfig is pickled to them)
    assert pickle.loads(pickle.dumps(cfg)).store_options == options
    assert_hidden(["AKIAEXAMPLE123456", WRONG_SECRET, TOKEN], "JobConfig", renderings(cfg) + [repr(vars(env))])


# -- errors from the real server and from malformed options --------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("case", ["wrong secret", "unknown access key", "unreachable endpoint"])
def test_store_errors_never_contain_the_secret(s3_server: S3Server, debug_logs: pytest.LogCaptureFixture,
                                               case: str, unused_port: int) -> None:
    options = {
        "wrong secret": s3_server.options(secret_key=WRONG_SECRET, retry=FAST),
        "unknown access key": s3_server.options(access_key="AKIAUNKNOWN9876543", secret_key=WRONG_SECRET,
                                                retry=FAST),
        "unreachable endpoint": s3_server.options(endpoint=f"http://127.0.0.1:{unused_port}",
                                                  secret_key=WRONG_SECRET, retry=FAST),
    }[case]
    root = f"s3://{s3_server.bucket}/secrets-{uuid.uuid4().hex}"
    errors: list[BaseException] = []
    calls: list[Callable[[], Any]] = [
        lambda: open_store(root, options).list(""),
        lambda: statelog.open(root, store_options=options),
        lambda: resolve_store_options(root, options) and open_store(root, resolve_store_options(root, options)).get("k"),
    ]
    for call in calls:
        with pytest.raises(StatelogError) as info:
            call()
        errors.append(info.value)
    texts = [exception_text(e) for e in errors]
    assert_hidden([WRONG_SECRET, s3_server.secret_key], f"the error of {case}", [*texts, debug_logs.text])


@pytest.mark.parametrize("endpoint", [f"user:{WRONG_SECRET}@127.0.0.1:1", f"http://user:{WRONG_SECRET}@127.0.0.1:1"])
def test_malformed_options_errors_never_echo_a_secret(endpoint: str) -> None:
    with pytest.raises(StatelogError) as info:
        open_store("s3://bucket/x", {"endpoint": endpoint})
    assert_hidden([WRONG_SECRET], "the error of a malformed endpoint", [exception_text(info.value)])
    with pytest.raises(StatelogError) as info:
        open_store(f"s3://user:{WRONG_SECRET}@bucket/x")
    assert_hidden([WRONG_SECRET], "the error of a URL with credentials", [exception_text(info.value)])
    with pytest.raises(StatelogError) as info:
        open_store("file:///tmp/x", {"secret_key": WRONG_SECRET})
    assert_hidden([WRONG_SECRET], "the error of options on a file root", [exception_text(info.value)])


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the command line ----------------------------------------------------------------------------


@pytest.mark.s3
def test_cli_arguments_logs_and_errors_never_show_the_secret(s3_server: S3Server,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from tools.cli import build_parser, main

    root = f"s3://{s3_server.bucket}/secrets-{uuid.uuid4().hex}"
    argv = ["-vv", "--store-option", f"endpoint={s3_server.endpoint}", "--store-option",
            f"access_key={s3_server.access_key}", "--store-option", f"secret_key={WRONG_SECRET}",
            "--store-option", "retry.max_attempts=1", "checkpoints", "list", root,
            "--store-option", f"session_token={TOKEN}"]
    args = build_parser().parse_args(argv)
    assert_hidden([WRONG_SECRET, TOKEN], "the parsed arguments", [repr(args), str(vars(args))])
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "statelog: error:" in out.err and "refused the credentials" in out.err
    assert_hidden([WRONG_SECRET, TOKEN], "the CLI's output", [out.out, out.err])


# -- the Spark data sources (their plans and readers are pickled to the executors) ---------------


@pytest.mark.s3
def test_spark_plans_and_readers_never_render_the_secret(s3_server: S3Server,
                                                         debug_logs: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pyspark")
    from statelog.readers.changes import plan_feed
    from statelog.readers.options import to_spark_options
    from statelog.readers.state import plan_state, state_schema
    from statelog.spark.changes import ChangeFeedReader
    from statelog.spark.datasource import StateReader
    from statelog.spark.metadata import StatelogMetadataDataSource
    from statelog.spark.schema import spark_schema

    secret = s3_server.secret_key
    root = f"s3://{s3_server.bucket}/secrets-{uuid.uuid4().hex}"
    job = statelog.open(root, store_options=s3_server.options())
    try:
        b = job.backend("op")
        count = b.get_state(statelog.ValueStateDescriptor("count", pa.int64(), default=0))
        b.set_current_key("k")
        count.update(1)
        cid = job.checkpoint().checkpoint_id
    finally:
        job.close()
    options = {"root": root, "operator": "op", "state": "count", **to_spark_options(s3_server.options())}
    plan = plan_state(options)
    assert plan.store["secret_key"] == secret  # shipped to the executors inside the pickled reader
    reader = StateReader(plan, spark_schema(state_schema(plan.state_info, None)))
    feed = plan_feed({**options, "changesFrom": str(cid), "changesTo": str(cid)})
    meta_source = StatelogMetadataDataSource(options)
    meta_reader = meta_source.reader(meta_source.schema())
    texts = [*renderings(plan), *renderings(reader), *renderings(feed), *renderings(ChangeFeedReader(feed, None)),
             *renderings(meta_reader), debug_logs.text]
    assert_hidden([secret], "a Spark plan or reader", texts)
