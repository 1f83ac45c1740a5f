"""``FileSink`` on a store URL (``s3://`` on SeaweedFS, ``file://``): the two-phase commit on
objects (pre-commit puts pending objects, commit puts ``part-*`` and deletes the pending one,
idempotently; recovery commits ``<= n`` and aborts the rest), chunked pending objects, errors
at construction, secrets in no rendering, and one job with worker SIGKILLs whose committed
output equals the golden output."""

from __future__ import annotations

import json
import logging
import pickle
import random
from typing import Any

import pytest

from runtime import FileSink, JobGraphError, committed_files, read_committed
from runtime.connectors.object_sink import (
    PART_PREFIX,
    PENDING_PREFIX,
    ObjectSinkOperator,
    commit_pending_object,
    object_name,
)
from statelog.store import open_store
from tests.support import jobs
from tests.support.chaos import kill_workers
from tests.support.jobs import make_env
from tests.support.s3server import RootSpec, S3Server


class _Ctx:
    subtask, parallelism, max_parallelism, run_id, attempt = 0, 1, 128, "abcdef0123", 1


def operator(root: RootSpec, chunk_bytes: int = 1 << 20) -> ObjectSinkOperator:
    sink = FileSink(root.url, store_options=root.options)
    assert sink.store_options is not None
    op = ObjectSinkOperator("out", root.url, sink.store_options, json.dumps, chunk_bytes)
    op.setup(_Ctx(), None)  # type: ignore[arg-type]
    op.open()
    return op


def keys(root: RootSpec, prefix: str) -> list[str]:
    with open_store(root.url, root.options) as store:
        return [o.key for o in store.list(prefix)]


def test_two_phase_commit_and_recovery(store_root: RootSpec) -> None:
    sink = FileSink(store_root.url, store_options=store_root.options)
    op = operator(store_root)
    op.process([1], None, 0)
    op.snapshot(5)  # pre-commit: a pending object, invisible to readers
    op.process([2], None, 0)
    op.snapshot(6)
    op.process([3], None, 0)  # in the local spool only
    assert keys(store_root, PENDING_PREFIX) == [
        PENDING_PREFIX + object_name(5, 0, "abcdef01-a1", 0),
        PENDING_PREFIX + object_name(6, 0, "abcdef01-a1", 0),
    ]
    assert read_committed(store_root.url, store_options=store_root.options) == []
    op.checkpoint_complete(5)
    assert read_committed(store_root.url, store_options=store_root.options) == [[1]]
    assert keys(store_root, PART_PREFIX) == [PART_PREFIX + object_name(5, 0, "abcdef01-a1", 0)]
    assert len(keys(store_root, PENDING_PREFIX)) == 1
    op.close()
    # a failure: the job restarts from checkpoint 5 -> transaction 6 is aborted
    sink.recover(5)
    assert keys(store_root, PENDING_PREFIX) == []
    assert read_committed(store_root.url, store_options=store_root.options) == [[1]]
    # the next attempt: recovery commits what belongs to the restored checkpoint, idempotently
    op2 = operator(store_root)
    op2.tag = "abcdef01-a2"
    op2.process([4], None, 0)
    op2.snapshot(7)
    op2.process([5], None, 0)
    op2.snapshot(8)
    sink.recover(7)
    sink.recover(7)
    op2.checkpoint_complete(7)  # a late notification finds it committed
    assert read_committed(store_root.url, store_options=store_root.options) == [[1], [4]]
    assert read_committed(store_root.url, upto_checkpoint=6, store_options=store_root.options) == [[1]]
    assert keys(store_root, PENDING_PREFIX) == []  # 8 > 7: aborted
    got = committed_files(store_root.url, store_options=store_root.options)
    assert got == [f"{store_root.url}/{PART_PREFIX}{object_name(c, 0, t, 0)}" for c, t in
                   ((5, "abcdef01-a1"), (7, "abcdef01-a2"))]  # fmt: skip
    op2.close()


def test_a_commit_interrupted_between_put_and_delete_completes(store_root: RootSpec) -> None:
    op = operator(store_root)
    for i in range(3):
        op.process({"i": i}, None, 0)
    op.snapshot(3)
    name = object_name(3, 0, "abcdef01-a1", 0)
    with open_store(store_root.url, store_root.options) as store:
        # the state a crash after the part's put and before the pending delete leaves
        store.put(PART_PREFIX + name, store.get(PENDING_PREFIX + name))
        assert store.exists(PENDING_PREFIX + name)
        FileSink(store_root.url, store_options=store_root.options).recover(3)
        assert not store.exists(PENDING_PREFIX + name)
        commit_pending_object(store, name)  # committed already: a no-op
        with pytest.raises(Exception, match="not found|does not exist|absent"):
            commit_pending_object(store, object_name(4, 0, "abcdef01-a1", 0))  # neither pending nor part
    assert read_committed(store_root.url, store_options=store_root.options) == [{"i": i} for i in range(3)]
    op.close()


@pytest.mark.s3
def test_large_transactions_are_put_in_chunks_cut_at_line_ends(s3_root: RootSpec) -> None:
    op = operator(s3_root, chunk_bytes=100)
    records = [{"n": i, "pad": "x" * (i % 7)} for i in range(40)]
    for r in records:
        op.process(r, None, 0)
    op.snapshot(1)
    pending = keys(s3_root, PENDING_PREFIX)
    assert len(pending) > 5, pending
    with open_store(s3_root.url, s3_root.options) as store:
        for key in pending:
            data = store.get(key)
            assert len(data) <= 100 and data.endswith(b"\n"), (key, data)
    op.checkpoint_complete(1)
    assert read_committed(s3_root.url, store_options=s3_root.options) == records
    op.snapshot(2)  # an empty transaction puts nothing
    op.process("y" * 300, None, 0)  # a line longer than a chunk is a chunk of its own
    op.process("z", None, 0)
    op.snapshot(3)
    assert [k.rsplit("-", 1)[-1] for k in keys(s3_root, PENDING_PREFIX)] == ["0000.jsonl", "0001.jsonl"]
    op.checkpoint_complete(3)
    assert read_committed(s3_root.url, upto_checkpoint=3, store_options=s3_root.options)[len(records):] == [
        "y" * 300, "z"
    ]
    assert keys(s3_root, PENDING_PREFIX) == []
    op.close()


@pytest.mark.s3
def test_the_secret_is_in_no_rendering_but_travels_in_the_pickle(s3_server: S3Server, s3_root: RootSpec) -> None:
    sink = FileSink(s3_root.url, store_options=s3_root.options)
    secret = s3_server.secret_key
    assert secret not in repr(sink) and secret not in str(sink)
    assert secret not in repr(vars(sink))
    clone = pickle.loads(pickle.dumps(sink))
    assert dict(clone.store_options) == dict(sink.store_options or {})  # workers open the same store


@pytest.mark.s3
def test_credentials_from_the_aws_environment_travel_with_the_pickled_sink(
    s3_server: S3Server, s3_root: RootSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in (("AWS_ENDPOINT_URL", s3_server.endpoint), ("AWS_REGION", s3_server.region),
                       ("AWS_ACCESS_KEY_ID", s3_server.access_key),
                       ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)):  # fmt: skip
        monkeypatch.setenv(var, value)
    sink = FileSink(s3_root.url)  # resolved here, from this process's environment
    assert s3_server.secret_key not in repr(sink)
    for var in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    clone = pickle.loads(pickle.dumps(sink))  # a worker without that environment
    assert clone.store_options is not None
    op = ObjectSinkOperator("out", s3_root.url, clone.store_options, json.dumps)
    op.setup(_Ctx(), None)  # type: ignore[arg-type]
    op.open()
    op.process("x", None, 0)
    op.snapshot(1)
    op.checkpoint_complete(1)
    op.close()
    assert read_committed(s3_root.url, store_options=s3_root.options) == ["x"]


def test_a_committed_object_that_is_not_json_lines_is_reported(store_root: RootSpec) -> None:
    with open_store(store_root.url, store_root.options) as store:
        store.put(PART_PREFIX + object_name(1, 0, "abcdef01-a1", 0), b'[1]\n{"broken\n')
        store.put(PART_PREFIX + "notes.txt", b"not a sink object: ignored")
    with pytest.raises(ValueError, match=r"part-0000000001-0000-abcdef01-a1-0000\.jsonl line 2 is not JSON"):
        read_committed(store_root.url, store_options=store_root.options)


@pytest.mark.parametrize(
    ("target", "options", "match"),
    [
        ("s3://", None, "names no bucket"),
        ("s3://Bad_Bucket/p", None, "not a valid S3 bucket name"),
        ("s3://bucket/p?secret_key=hunter2-secret", None, "query string"),
        ("s3://bucket/p", {"bogus": 1, "secret_key": "hunter2-secret"}, "unknown S3 store option"),
        ("file://relative/path", None, "three slashes"),
        ("file:///tmp/x", {"region": "x"}, "takes no options"),
        ("ftp://host/out", None, "unsupported URL scheme; pass a local directory, an s3://"),
        ("/tmp/out", {"region": "x"}, "store_options apply to s3:// .* URLs only"),
        ("", None, "needs a directory path or an s3:// URL"),
    ],
)
def test_bad_urls_and_options_are_refused_at_construction(target: str, options: Any, match: str) -> None:
    with pytest.raises(JobGraphError, match=match) as exc:
        FileSink(target, store_options=options)
    assert "hunter2-secret" not in str(exc.value)


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.fault
def test_worker_kills_with_an_s3_sink_give_the_golden_output(
    s3_server: S3Server, s3_root: RootSpec, file_root: RootSpec, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    out = f"{s3_root.url}/windows"
    env = make_env(file_root)
    jobs.build_clicks(env, FileSink(out, store_options=s3_root.options), 6000, rate=2000)
    client = env.execute_async("s3-sink-kills")
    kills = kill_workers(client, 3, random.Random(11))
    result = client.wait(120)
    assert kills.count == 3, kills
    assert result.attempts == 4, result.failures
    assert sorted(read_committed(out, store_options=s3_root.options)) == jobs.golden_windows(6000)
    assert keys(s3_root, "windows/" + PENDING_PREFIX) == []  # the last checkpoint's commit ran
    parts = committed_files(out, store_options=s3_root.options)
    assert parts and all(p.startswith(f"{out}/part-") for p in parts), parts
    captured = capfd.readouterr()
    for text in (caplog.text, captured.out, captured.err, repr(result.failures)):
        assert s3_server.secret_key not in text
