"""Options that make no sense are refused, checked in one place.

Every duration, size, count and name option has a documented range in
its options object (``statelog/options/engine.py``, ``materializer/options.py``,
``runtime/config.py``): the CLI refuses a bad value with exit code 2 and one line on stderr
(no traceback, before anything is written), the library constructors with a ``ConfigError``
naming the option. ``savepoint:NAME`` is one checkpoint reference for every command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statelog
from materializer.background import start_background
from materializer.daemon.loop import MaterializerDaemon
from materializer.options import GC_GRACE, LEASE_TTL, MAX_TAIL_BYTES
from materializer.savepoint import create_savepoint
from runtime import StreamExecutionEnvironment
from statelog.checkpoint.writer_lease import WriterLease
from statelog.errors import ConfigError
from statelog.options.engine import WriterOptions
from statelog.options.values import parse_checkpoint_ref
from statelog.store import open_store
from tests.support.gc_job import OPTIONS, build
from tests.support.s3server import RootSpec
from tools.cli import main

# -- the CLI -------------------------------------------------------------------------------------

RUN = ["materializer", "run", "--once"]  # --once: a value wrongly accepted must not run a daemon forever
BAD_CLI = [
    (RUN, ["--lease-ttl", "1ms"], "--lease-ttl must be in [1s, 1d], got 1ms"),
    (RUN, ["--lease-ttl", "0"], "--lease-ttl must be in [1s, 1d]"),
    (RUN, ["--lease-ttl", "2d"], "--lease-ttl must be in [1s, 1d], got 2d"),
    (RUN, ["--lease-ttl", "soon"], "--lease-ttl: invalid duration 'soon'"),
    (RUN, ["--max-tail-bytes", "0"], "--max-tail-bytes must be in [1 byte, 1024TB], got 0 bytes"),
    (RUN, ["--max-tail-bytes", "12XB"], "--max-tail-bytes: invalid size '12XB'"),
    (RUN, ["--owner", ""], "--owner must not be empty or blank"),
    (RUN, ["--owner", "   "], "--owner must not be empty or blank"),
    (RUN, ["--owner", "a\nb"], "--owner must not contain control characters"),
    (RUN, ["--interval", "0s"], "--interval must be in [1ms, 30d], got 0"),
    (RUN, ["--interval", "5x"], "--interval: invalid duration '5x'"),
    (RUN, ["--interval", "31d"], "--interval must be in [1ms, 30d], got 31d"),
    (RUN, ["--poll", "0"], "--poll must be in [1ms, 1h]"),
    (RUN, ["--poll", "2h"], "--poll must be in [1ms, 1h], got 2h"),
    (RUN, ["--gc-grace", "400d"], "--gc-grace must be in [0ms, 365d], got 400d"),
    (RUN, ["--retain", "0"], "--retain: invalid count '0'"),
    (RUN, ["--retain", "two"], "--retain: invalid count 'two'"),
    (["gc"], ["--grace", "400d"], "--grace must be in [0ms, 365d], got 400d"),
    (["gc"], ["--grace=-5m"], "--grace: invalid duration '-5m'"),
    (["gc"], ["--retain", "0"], "--retain: invalid count '0'"),
    (["checkpoints", "show"], ["savepoint:"], "names no savepoint"),
    (["checkpoints", "show"], ["yesterday"], "must be \"latest\", a checkpoint id or \"savepoint:NAME\""),
    (["savepoint", "create"], ["--checkpoint", "savepoint:sp", "--name", "x"], "names a savepoint, this command needs"),
    (["savepoint", "create"], ["--checkpoint", "latest", "--name", ""], "savepoint name"),
    (["verify"], ["--checkpoint", "-3"], "must be \"latest\", a checkpoint id"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> RootSpec:
    """A job root with checkpoints 1 and 2 and savepoint ``sp`` of checkpoint 2."""
    spec = RootSpec(tmp_path_factory.mktemp("options").as_uri())
    build(spec, rounds=2, materialize_after=())
    with spec.open() as store:
        create_savepoint(store, 2, "sp", options=OPTIONS)
    return spec


def tree(spec: RootSpec) -> dict[str, int]:
    base = Path(spec.url.removeprefix("file://"))
    return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("command", "argv", "message"), BAD_CLI, ids=[" ".join(c + a) for c, a, _ in BAD_CLI])
def test_cli_refuses_bad_options_with_one_line(
    root: RootSpec, capsys: pytest.CaptureFixture[str], command: list[str], argv: list[str], message: str
) -> None:
    before = tree(root)
    assert main([*command, root.url, *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err and captured.out == "", err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("statelog: error: ") and message in err, err
    assert tree(root) == before  # refused before anything was written


def test_savepoint_reference_is_accepted_by_checkpoints_show(
    root: RootSpec, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    assert main(["checkpoints", "show", root.url, "savepoint:sp", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "savepoint" and shown["id"] == 2
    assert shown["metadata_key"] == "savepoints/sp/_metadata.json"
    assert main(["checkpoints", "show", root.url, "savepoint:sp"]) == 0
    assert "Savepoint sp (of checkpoint 2)" in capsys.readouterr().out
    assert main(["checkpoints", "show", root.url, "savepoint:nope"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "savepoint 'nope' does not exist" in err, err


def test_one_parser_of_checkpoint_references() -> None:
    p = parse_checkpoint_ref
    assert (p("latest").kind, p(" LATEST ").kind) == ("latest", "latest")
    assert p("17").checkpoint_id == 17 and p(17).checkpoint_id == 17
    assert p("savepoint:before-upgrade").savepoint == "before-upgrade"
    assert p("none", allow_none=True).kind == "none"
    assert str(p("savepoint:x")) == "savepoint:x" and str(p(3)) == "3"
    for bad in ("none", "", "-1", "1.5", "savepoint:", "checkpoint:3", -1, True, 2.0, None):
        with pytest.raises(ConfigError):
            p(bad)


def test_restore_and_spark_resolve_accept_the_same_references(root: RootSpec) -> None:
    pytest.importorskip("pyspark")
    from statelog.readers import options as spark_opt

    job = statelog.open(root.url, create=False, writer_lease=False)
    try:
        for which in ("latest", "2", "savepoint:sp"):
            assert job.resolve_checkpoint(which).checkpoint_id == 2  # type: ignore[union-attr]
            assert spark_opt.resolve(job, which).checkpoint_id == 2
        for which in ("savepoint:", "yesterday"):
            with pytest.raises(ConfigError):
                job.resolve_checkpoint(which)
            with pytest.raises(ConfigError):
                spark_opt.resolve(job, which)
    finally:
        job.close()


# -- the library ---------------------------------------------------------------------------------


def daemon(store: Any, **kw: Any) -> Any:
    return MaterializerDaemon(store, **kw)


BAD_DAEMON = [
    {"lease_ttl_s": 0.001},
    {"lease_ttl_s": 0.5},
    {"lease_ttl_s": 2 * 86400},
    {"lease_ttl_s": "1ms"},
    {"interval_s": 0},
    {"interval_s": -1},
    {"interval_s": float("nan")},
    {"max_tail_bytes": 0},
    {"max_tail_bytes": -5},
    {"max_tail_bytes": 1.5},
    {"gc_grace_s": -1},
    {"poll_s": 0},
    {"gc_interval_s": 0},
    {"retain_checkpoints": 0},
    {"retain_checkpoints": True},
    {"owner": ""},
    {"owner": "  "},
    {"owner": 7},
]


@pytest.mark.parametrize("kwargs", BAD_DAEMON, ids=[repr(k) for k in BAD_DAEMON])
def test_materializer_daemon_refuses_bad_options(root: RootSpec, kwargs: dict[str, Any]) -> None:
    (name,) = kwargs
    with root.open() as store:
        with pytest.raises(ConfigError, match=name):
            MaterializerDaemon(store, **kwargs)
        with pytest.raises(ConfigError, match=name):
            start_background(store, **kwargs)


def test_materializer_daemon_accepts_the_ends_of_each_range(root: RootSpec) -> None:
    with root.open() as store:
        d = MaterializerDaemon(store, lease_ttl_s=1.0, interval_s="1ms", max_tail_bytes=1, gc_grace_s=0,
                               poll_s=3600, owner="blue")
        assert (d.lease.ttl_s, d.interval_s, d.max_tail_bytes, d.poll_s, d.owner) == (1.0, 0.001, 1, 3600.0, "blue")
        assert MaterializerDaemon(store, lease_ttl_s="1d").lease.ttl_s == 86400.0


BAD_WRITER = [
    {"persist_delay": -0.1},
    {"persist_delay": 2 * 86400},
    {"flush_records": 0},
    {"max_buffered_records": 0},
    {"max_inflight_bytes": 0},
    {"upload_threads": 0},
    {"upload_threads": 65},
    {"encode_batch_records": 0},
]


@pytest.mark.parametrize("kwargs", BAD_WRITER, ids=[repr(k) for k in BAD_WRITER])
def test_writer_options_are_refused_by_the_writer_the_job_and_the_runtime(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    (name,) = kwargs
    url = (tmp_path / "root").as_uri()
    with pytest.raises(ConfigError, match=name):
        WriterOptions(**kwargs)
    with pytest.raises(ConfigError, match=name):
        statelog.open(url, writer_options=kwargs)
    with pytest.raises(ConfigError, match=name):
        StreamExecutionEnvironment(state_root=url, writer_options=kwargs)
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").iterdir())


BAD_JOB: list[tuple[str, dict[str, Any]]] = [
    ("retain_checkpoints", {"retain_checkpoints": 0}),
    ("writer_lease_ttl_s", {"writer_lease_ttl_s": 0.001}),
    ("writer_lease_ttl_s", {"writer_lease_ttl_s": 7200}),
    ("writer_owner", {"writer_owner": ""}),
]


@pytest.mark.parametrize(("name", "kwargs"), BAD_JOB, ids=[n for n, _ in BAD_JOB])
def test_state_job_refuses_bad_options(tmp_path: Path, name: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=name):
        statelog.open((tmp_path / "root").as_uri(), **kwargs)


def test_writer_lease_refuses_an_empty_owner(tmp_path: Path) -> None:
    with open_store((tmp_path / "root").as_uri()) as store, pytest.raises(ConfigError, match="writer_owner"):
        WriterLease(store, owner="")


BAD_RUNTIME: list[tuple[str, dict[str, Any]]] = [
    ("checkpoint_interval_s", {"checkpoint_interval_s": 0}),
    ("checkpoint_interval_s", {"checkpoint_interval_s": 0.001}),
    ("checkpoint_timeout_s", {"checkpoint_timeout_s": 0}),
    ("tolerable_failed_checkpoints", {"tolerable_failed_checkpoints": -1}),
    ("retain_checkpoints", {"retain_checkpoints": 0}),
    ("batch_size", {"batch_size": 0}),
    ("channel_capacity", {"channel_capacity": 0}),
    ("lease_ttl_s", {"materializer": {"lease_ttl_s": 0.001}}),
    ("max_tail_bytes", {"materializer": {"max_tail_bytes": 0}}),
    ("owner", {"materializer": {"owner": ""}}),
]


@pytest.mark.parametrize(("name", "kwargs"), BAD_RUNTIME, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_RUNTIME)])
def test_stream_execution_environment_refuses_bad_options(
    tmp_path: Path, name: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match=name):
        StreamExecutionEnvironment(state_root=(tmp_path / "root").as_uri(), **kwargs)


@pytest.mark.parametrize(
    ("spec", "good", "bad"),
    [
        (LEASE_TTL, ["1s", 1, "30s", "1d"], ["999ms", 0, -1, "1.5d", None, "x", True]),
        (MAX_TAIL_BYTES, ["1", 1, "256MB", 1 << 50], [0, "0", -1, 2.0, (1 << 50) + 1]),
        (GC_GRACE, [0, "0", "10m"], [-1, "366d"]),
    ],
)
def test_ranges(spec: Any, good: list[Any], bad: list[Any]) -> None:
    check: Callable[[Any], Any] = spec.check
    for value in good:
        check(value)
    for value in bad:
        with pytest.raises(ConfigError, match=spec.name):
            check(value)
