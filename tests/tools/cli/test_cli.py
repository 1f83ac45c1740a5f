"""The ``statelog`` CLI against real job roots built with the library (file:// and SeaweedFS)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import zlib
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

import statelog
from statelog import (
    CheckpointMetadata,
)
from statelog.changelog import format as fmt
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import OperatorState
from statelog.keys.groups import KeyGroupRange
from statelog.layout import checkpoint_key
from tests.support.cli_job import COUNT, build_job, s3_args
from tests.support.s3server import RootSpec, S3Server
from tools.cli import main, parse_store_options

REPO = Path(__file__).resolve().parents[3]
# -- helpers -------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code, out, err = run(capsys, *argv, "--json")
    return code, json.loads(out), err


def local_path(spec: RootSpec, key: str = "") -> Path:
    return Path(unquote(urlsplit(spec.url).path)) / key


def segments_of(metas: list[CheckpointMetadata]) -> dict[str, int]:
    return {
        s.name: s.size
        for m in metas
        for op in m.operators.values()
        for h in op.subtasks
        for r in h.changelog
        for s in r.segments
    }


def flip_byte(data: bytes, offset: int = fmt.HEADER_SIZE + 10) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


def only_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("statelog: error: ")
    assert "Traceback" not in err
    return lines[0]


# -- checkpoints list ----------------------------------------------------------------------------


def test_list_json_has_the_checkpoint_fields(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(file_root)
    code, rows, err = run_json(capsys, "checkpoints", "list", file_root.url)
    assert code == 0, err
    assert [r["id"] for r in rows] == [1, 2, 3]
    for row, meta in zip(rows, metas, strict=True):
        assert row["kind"] == "checkpoint"
        assert row["timestamp_ms"] == meta.timestamp_ms
        parsed = datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00"))
        assert parsed.utcoffset() is not None and parsed.utcoffset().total_seconds() == 0
        assert int(parsed.timestamp() * 1000) == meta.timestamp_ms
        assert row["changelog_bytes"] == meta.changelog_bytes > 0
        assert row["materialization"] == []
        assert row["sources"] == meta.sources == {"events": {"p0": meta.checkpoint_id * 40}}
        assert row["stats"] == meta.stats and "sync_ms" in row["stats"]
        assert row["job_id"] == meta.job_id
        assert row["max_parallelism"] == 128
        assert row["segments"] == len(meta.segment_names())
        assert row["operators"] == [
            {"uid": "counter", "parallelism": 2, "states": ["count"]},
            {"uid": "sessions", "parallelism": 1, "states": ["attrs", "events"]},
        ]
    assert rows[0]["changelog_bytes"] < rows[1]["changelog_bytes"] < rows[2]["changelog_bytes"]


def test_list_table_and_empty_job(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    statelog.open(file_root.url).close()  # a job without checkpoints
    code, rows, _ = run_json(capsys, "checkpoints", "list", file_root.url)
    assert (code, rows) == (0, [])
    code, out, _ = run(capsys, "checkpoints", "list", file_root.url)
    assert code == 0 and "no retained checkpoints" in out
    build_job(file_root, checkpoints=2)
    code, out, _ = run(capsys, "checkpoints", "list", file_root.url)
    assert code == 0
    assert "counter" in out and "sessions" in out and "KiB" in out
    assert "materialized" in out  # the column header


def test_list_shows_only_retained(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    build_job(file_root, checkpoints=4, retain_checkpoints=2)
    code, rows, _ = run_json(capsys, "checkpoints", "list", file_root.url)
    assert code == 0 and [r["id"] for r in rows] == [3, 4]


# -- checkpoints show ----------------------------------------------------------------------------


def test_show_json_details(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    metas = build_job(file_root)
    meta = metas[1]
    code, d, err = run_json(capsys, "checkpoints", "show", file_root.url, "2")
    assert code == 0, err
    assert d["id"] == 2 and d["sources"] == {"events": {"p0": 80}}
    assert d["metadata_key"] == checkpoint_key(2)
    assert d["changelog_bytes"] == meta.changelog_bytes
    assert d["segment_bytes"] == sum(segments_of([meta]).values())
    counter, sessions = d["operators"]
    assert counter["uid"] == "counter" and counter["parallelism"] == 2
    assert [s["key_groups"] for s in counter["subtasks"]] == [[0, 63], [64, 127]]
    assert counter["states"] == [
        {
            "name": "count",
            "kind": "value",
            "value_type": "int64",
            "user_key_type": None,
            "ttl_ms": None,
        }
    ]
    assert "__timers_event" in counter["internal_states"]
    assert {
        s["name"]: (s["kind"], s["value_type"], s["user_key_type"]) for s in sessions["states"]
    } == {
        "attrs": ("map", "pickle", "string"),
        "events": ("list", "string", None),
    }
    for op in (counter, sessions):
        handles = meta.operators[op["uid"]].subtasks
        for sub, handle in zip(op["subtasks"], handles, strict=True):
            # one changelog range per state stream that has records
            assert sub["changelog_ranges"] == len(handle.changelog) >= 1
            assert sub["segments"] == len(handle.segment_names()) == 2  # one per checkpoint so far
            assert sub["changelog_bytes"] == handle.changelog_bytes
            assert [r["stream"] for r in sub["ranges"]] == [r.stream for r in handle.changelog]
            for rng, want in zip(sub["ranges"], handle.changelog, strict=True):
                assert [s["name"] for s in rng["segments"]] == [s.name for s in want.segments]


def test_show_table_and_latest(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    build_job(file_root)
    code, out, _ = run(capsys, "checkpoints", "show", file_root.url, "latest")
    assert code == 0
    for text in (
        "Checkpoint 3",
        "Source positions",
        "events",
        "0..63",
        "64..127",
        "int64",
        "pickle",
    ):
        assert text in out
    code, d, _ = run_json(capsys, "checkpoints", "show", file_root.url, "latest")
    assert code == 0 and d["id"] == 3


def test_show_unknown_checkpoint_lists_retained(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    build_job(file_root, checkpoints=4, retain_checkpoints=2)
    for which in ("1", "99"):
        code, out, err = run(capsys, "checkpoints", "show", file_root.url, which)
        line = only_line(err)
        assert code == 2 and out == ""
        assert f"checkpoint {which} does not exist" in line
        assert "retained checkpoints: 3, 4" in line
    code, _, err = run(capsys, "checkpoints", "show", file_root.url, "abc")
    assert code == 2 and 'must be "latest", a checkpoint id or "savepoint:NAME"' in only_line(err)


# -- errors: roots and options -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        ("relative/dir", "neither a URL nor an absolute path"),
        ("ftp://host/x", "unsupported job root scheme"),
        ("s3://Bad_Bucket/x", "is not a valid S3 bucket name"),
        ("file://host/x", "names host"),
        ("s3://AKIAKEY:topsecretvalue@bucket/x", "embeds credentials"),
    ],
)
@pytest.mark.parametrize("command", [["checkpoints", "list"], ["verify"]])
def test_malformed_root_url(
    root: str, expected: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *command, root)
    assert code == 2 and out == ""
    assert expected in only_line(err)
    assert "topsecretvalue" not in err


@pytest.mark.parametrize("exists", [True, False])
def test_root_that_is_not_a_job(
    tmp_path: Path, exists: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "nojob"
    if exists:
        root.mkdir()
        (root / "notes.txt").write_text("not a job")
    for argv in (["checkpoints", "list"], ["verify"], ["checkpoints", "show"]):
        extra = ["1"] if argv[-1] == "show" else []
        code, _, err = run(capsys, *argv, root.as_uri(), *extra)
        assert code == 2
        assert "is not a statelog job root" in only_line(err)
    # Nothing was created: no job descriptor, no directory.
    if exists:
        assert [p.name for p in root.iterdir()] == ["notes.txt"]
    else:
        assert not root.exists()


def test_store_option_errors(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    build_job(file_root, checkpoints=1)
    code, _, err = run(capsys, "--store-option", "endpoint=http://x:1", "verify", file_root.url)
    assert code == 2 and "a file job root takes no options" in only_line(err)
    code, _, err = run(
        capsys, "checkpoints", "list", file_root.url, "--store-option", "hunter2secret"
    )
    assert code == 2 and "--store-option #1 is not of the form KEY=VALUE" in only_line(err)
    assert "hunter2secret" not in err
    code, _, err = run(
        capsys, "--store-option", "region=a", "--store-option", "region=b", "verify", "/x"
    )
    assert code == 2 and "region is given twice" in only_line(err)


def test_parse_store_options() -> None:
    opts = parse_store_options(
        [
            "endpoint=http://h:1",
            "secure=false",
            "retry.max_attempts=2",
            "retry.base_delay=0.5",
            "secret_key=a=b",
        ]
    )
    assert opts == {
        "endpoint": "http://h:1",
        "secure": "false",
        "secret_key": "a=b",
        "retry": {"max_attempts": 2, "base_delay": 0.5},
    }


def test_usage_errors_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["checkpoints"]) == 2
    assert main(["verify", "/x", "--bogus"]) == 2
    capsys.readouterr()
    assert main(["--help"]) == 0
    assert "verify" in capsys.readouterr().out


# -- verify on file:// ---------------------------------------------------------------------------


def test_verify_passes(file_root: RootSpec, capsys: pytest.CaptureFixture[str]) -> None:
    metas = build_job(file_root)
    segments = segments_of(metas)
    code, report, err = run_json(capsys, "verify", file_root.url)
    assert code == 0, err
    assert report["ok"] is True and report["faults"] == []
    assert report["checkpoints"] == [1, 2, 3] and report["checkpoints_checked"] == 3
    assert report["segments_checked"] == len(segments) == 3  # each verified once
    assert report["bytes_checked"] == sum(segments.values())
    distinct = {r for m in metas for op in m.operators.values() for h in op.subtasks for r in h.changelog}
    assert report["ranges_checked"] == len(distinct)  # every distinct range read once
    assert report["records_checked"] > 0
    assert report["job_id"] == metas[0].job_id
    code, out, _ = run(capsys, "verify", file_root.url)
    assert code == 0 and "3 checkpoint(s), 0 savepoint(s), 3 segment(s)" in out and "OK" in out
    code, report, _ = run_json(capsys, "verify", file_root.url, "--checkpoint", "1")
    assert code == 0 and report["checkpoints"] == [1] and report["segments_checked"] == 1


def test_verify_flipped_byte_names_the_segment(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(file_root)
    key = sorted(segments_of(metas))[1]  # referenced by checkpoints 2 and 3
    path = local_path(file_root, key)
    path.write_bytes(flip_byte(path.read_bytes()))
    code, report, _ = run_json(capsys, "verify", file_root.url)
    assert code == 1 and report["ok"] is False
    (fault,) = report["faults"]
    assert fault["object"] == key and key in fault["message"]
    assert fault["error"] == "CorruptionError" and fault["checkpoints"] == [2, 3]
    assert report["segments_checked"] == 2  # the others were still checked
    # only the ranges of checkpoint 1 avoid the corrupt segment
    ok_ranges = {r for op in metas[0].operators.values() for h in op.subtasks for r in h.changelog}
    assert report["ranges_checked"] == len(ok_ranges)
    code, out, _ = run(capsys, "verify", file_root.url)
    assert code == 1 and key in out and "checksum mismatch" in out and "FAILED" in out


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_verify_missing_or_truncated_segment(
    file_root: RootSpec, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(file_root)
    key = sorted(segments_of(metas))[-1]
    path = local_path(file_root, key)
    if damage == "delete":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:-5])
    code, report, _ = run_json(capsys, "verify", file_root.url)
    assert code == 1
    (fault,) = report["faults"]
    assert fault["object"] == key and fault["checkpoints"] == [3]
    assert ("missing" if damage == "delete" else "the checkpoints recorded") in fault["message"]
    code, out, _ = run(capsys, "verify", file_root.url, "--checkpoint", "3")
    assert code == 1 and key in out
    code, _, _ = run(capsys, "verify", file_root.url, "--checkpoint", "2")
    assert code == 0  # checkpoint 2 does not reference it


def test_verify_reports_every_fault(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(file_root)
    first, second, third = sorted(segments_of(metas))
    local_path(file_root, first).write_bytes(
        flip_byte(local_path(file_root, first).read_bytes(), -3)
    )
    local_path(file_root, third).unlink()
    meta_path = local_path(file_root, checkpoint_key(2))
    meta_path.write_bytes(flip_byte(meta_path.read_bytes(), 40))
    job_path = local_path(file_root, "job.json")
    job_path.write_bytes(job_path.read_bytes().replace(b'"version": 1', b'"version": 9'))
    code, report, _ = run_json(capsys, "verify", file_root.url)
    assert code == 1
    objects = [f["object"] for f in report["faults"]]
    assert objects == sorted([first, third, checkpoint_key(2), "job.json"])
    assert report["job_id"] is None
    # A listing cannot go on past corrupt metadata: a clear error naming the object.
    code, _, err = run(capsys, "checkpoints", "list", file_root.url)
    assert code == 2 and "job.json" in only_line(err)


def test_malformed_metadata_with_a_valid_checksum_is_named(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(file_root, checkpoints=1)
    body = metas[0].body()
    body["checkpoint_id"] = 2
    body["operators"]["counter"]["subtasks"][0]["key_groups"] = [0]  # not [start, end]
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    store = file_root.open()
    store.put(checkpoint_key(2), json.dumps({"crc32": zlib.crc32(canon), "body": body}).encode())
    store.close()
    code, _, err = run(capsys, "checkpoints", "list", file_root.url)
    assert code == 2 and f"checkpoint metadata {checkpoint_key(2)} is malformed" in only_line(err)
    code, report, _ = run_json(capsys, "verify", file_root.url)
    assert code == 1
    (fault,) = report["faults"]
    assert fault["object"] == checkpoint_key(2) and checkpoint_key(2) in fault["message"]
    assert report["segments_checked"] == 1  # checkpoint 1 was still checked


def test_verify_checks_metadata_consistency(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(file_root)
    last = metas[-1]
    counter = last.operators["counter"]
    h0, h1 = counter.subtasks
    bad_kg = replace(h0, key_groups=KeyGroupRange(0, 10))
    gap = replace(h1.changelog[0], segments=h1.changelog[0].segments[::2])  # middle one dropped
    bad_gap = replace(h1, changelog=(gap,))
    operators = {**last.operators, "counter": OperatorState("counter", 2, (bad_kg, bad_gap))}
    forged = replace(last, checkpoint_id=4, operators=operators)
    store = file_root.open()
    JobCatalog(store).publish(forged)
    store.close()
    code, report, _ = run_json(capsys, "verify", file_root.url)
    assert code == 1
    messages = [f["message"] for f in report["faults"] if f["object"] == checkpoint_key(4)]
    assert any("subtask 0 has key groups [0..10], expected [0..63]" in m for m in messages)
    assert any("is not covered by its segments" in m for m in messages)
    assert all(f["checkpoints"] == [4] for f in report["faults"])


# -- s3:// (SeaweedFS) ---------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_list_show_verify(
    s3_server: S3Server, s3_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(s3_root, checkpoints=2)
    opts = s3_args(s3_server)
    code, rows, err = run_json(capsys, *opts, "checkpoints", "list", s3_root.url)
    assert code == 0, err
    assert [r["changelog_bytes"] for r in rows] == [m.changelog_bytes for m in metas]
    code, d, _ = run_json(capsys, "checkpoints", "show", s3_root.url, "2", *opts)
    assert code == 0 and d["id"] == 2
    code, report, err = run_json(capsys, "verify", s3_root.url, *opts, "-v")
    assert code == 0 and report["ok"] and report["segments_checked"] == 2
    assert s3_server.secret_key not in err  # verbose logging never shows the secret
    assert "secret_key" in err and "***" in err


@pytest.mark.s3
def test_s3_verify_corrupted_object(
    s3_server: S3Server, s3_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    metas = build_job(s3_root, checkpoints=2)
    first, second = sorted(segments_of(metas))
    prefix = s3_root.url.removeprefix(f"s3://{s3_server.bucket}/")
    raw = s3_server.raw_client()
    resp = raw.get_object(s3_server.bucket, f"{prefix}/{second}")
    try:
        data = resp.read()
    finally:
        resp.close()
        resp.release_conn()
    bad = flip_byte(data)
    raw.put_object(s3_server.bucket, f"{prefix}/{second}", io.BytesIO(bad), len(bad))  # in place
    store = s3_root.open()  # and the first one through the store: delete, then put other bytes
    store.delete(first)
    store.put(first, flip_byte(data[: fmt.HEADER_SIZE] + b"x" * 40, 2))
    store.close()
    code, report, _ = run_json(capsys, "verify", s3_root.url, *s3_args(s3_server))
    assert code == 1
    assert sorted(f["object"] for f in report["faults"]) == [first, second]
    by_key = {f["object"]: f for f in report["faults"]}
    assert "checksum mismatch" in by_key[second]["message"]
    assert "bytes, the checkpoints recorded" in by_key[first]["message"]


@pytest.mark.s3
def test_s3_wrong_secret_is_a_clear_error(
    s3_server: S3Server, s3_root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    build_job(s3_root, checkpoints=1)
    wrong = "wrong-secret-0123456789abcdefghijklmnop"
    for argv in (["verify"], ["checkpoints", "list"]):
        code, out, err = run(capsys, *argv, s3_root.url, *s3_args(s3_server, wrong), "-vv")
        assert code == 2 and out == ""
        assert "refused the credentials" in err.strip().splitlines()[-1]
        assert wrong not in err and s3_server.secret_key not in err


def test_unreachable_endpoint_is_one_line_and_retries_show_with_v(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the endpoint: one error line after the last attempt; each retry is
    logged only with -v."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    with socket.socket() as closed:  # bound, never listening: every connection is refused
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        argv = ["checkpoints", "list", "s3://statelog-unreachable/root", "--store-option", f"endpoint={endpoint}"]
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        line = only_line(err)
        assert "failed after 6 attempt(s)" in line and f"cannot reach {endpoint}" in line
        assert "check that the S3 server runs" in line
        code, out, err = run(capsys, *argv, "-v")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    retries = [ln for ln in lines if "WARNING statelog.store.retry:" in ln]
    assert [f"(attempt {n} of 6)" in r for n, r in enumerate(retries, 1)] == [True] * 5, err
    assert lines[-1] == line


# -- the installed entry points ------------------------------------------------------------------


def test_console_script_in_a_subprocess(file_root: RootSpec, tmp_path: Path) -> None:
    metas = build_job(file_root, checkpoints=2)
    script = Path(sys.executable).with_name("statelog")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "tools.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [*argv, "checkpoints", "list", file_root.url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in json.loads(proc.stdout)] == [m.checkpoint_id for m in metas]
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "checkpoints", "show", file_root.url, "7"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"statelog: error: checkpoint 7 does not exist in {file_root.url}: no metadata object "
        "checkpoints/chk-000000000007.json (retained checkpoints: 1, 2); pick one of those, e.g. with "
        "`statelog checkpoints list ROOT`"
    )


# -- checkpoint statistics of the runtime ---------------------------------------------------------


def test_list_and_show_render_runtime_checkpoint_stats(
    file_root: RootSpec, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # no folding of the stats column
    runtime_stats = {
        "duration_ms": 25.4,
        "sync_ms": 1.234,
        "async_ms": 8.0,
        "alignment_ms": 0.3,
        "incremental_bytes": 12 * 1024,
        "source_records": 123_456,
        "records_per_s": 40_123.4,
        "attempt": 2,
        "mode": "exactly_once_unaligned",
        "final": False,
        "inflight_bytes": 2048,
    }
    job = statelog.open(file_root.url, store_options=dict(file_root.options))
    try:
        backend = job.backend("counter")
        backend.set_current_key("k")
        backend.get_state(COUNT).update(1)
        handle = backend.snapshot(1).result(30)
        job.publish_checkpoint(1, [handle], {"events": {"p0": 1}}, runtime_stats)
    finally:
        job.close()
    code, out, err = run(capsys, "checkpoints", "list", file_root.url)
    assert code == 0, err
    assert "stats" in out
    assert (
        "sync 1.2 ms, async 8.0 ms, align 0.3 ms, 12.0 KiB, in-flight 2.0 KiB, 40k ev/s" in out
    )
    code, rows, _ = run_json(capsys, "checkpoints", "list", file_root.url)
    assert code == 0 and rows[0]["stats"] == runtime_stats
    code, out, err = run(capsys, "checkpoints", "show", file_root.url, "1")
    assert code == 0, err
    assert "Checkpoint statistics" in out
    lines = out.splitlines()
    for label, value in (
        ("duration", "25.4 ms"),
        ("synchronous part", "1.2 ms"),
        ("asynchronous part", "8.0 ms"),
        ("alignment", "0.3 ms"),
        ("bytes uploaded", "12.0 KiB"),
        ("in-flight data", "2.0 KiB"),
        ("throughput", "40k ev/s"),
        ("source records", "123,456"),
        ("mode", "exactly_once_unaligned"),
        ("attempt", "2"),
        ("final", "no"),
    ):
        assert any(label in ln and value in ln for ln in lines), (label, value, out)
    # a checkpoint without runtime statistics (one-call checkpoint of the library) still renders
    build_job(file_root, checkpoints=1, restore="none")
    code, out, err = run(capsys, "checkpoints", "list", file_root.url)
    assert code == 0, err
    assert out.count(", async ") == 2  # the library's own stats (sync, async, bytes) too
