"""Writer and materializer options are typed objects.

Each option group is one frozen dataclass (``statelog.options.engine.WriterOptions``,
``materializer.options.MaterializerOptions``) holding the defaults, ranges and docs; every
entry point (``statelog.open``, the changelog writer, the materializer daemon,
``start_background``, the runtime's ``StreamExecutionEnvironment`` and the CLI) accepts
exactly its fields, refuses any other name with the one error of ``from_mapping`` and uses
the dataclass's defaults.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

import statelog
from materializer.background import start_background
from materializer.daemon.loop import MaterializerDaemon
from materializer.options import MaterializerOptions
from runtime import StreamExecutionEnvironment
from statelog.changelog.format import BLOCK_CODECS, Codec
from statelog.changelog.writer import ChangelogWriter
from statelog.errors import ConfigError
from statelog.options.engine import WriterOptions
from statelog.restore.ondemand.options import OnDemandOptions
from statelog.store import open_store
from tools.cli import main


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def test_every_option_has_a_doc_and_a_check() -> None:
    for cls in (WriterOptions, MaterializerOptions, OnDemandOptions):
        for f in dataclasses.fields(cls):
            assert f.metadata["doc"].strip(), (cls.__name__, f.name)
            assert f.metadata["check"] is not None, (cls.__name__, f.name)


def test_writer_defaults_come_from_the_dataclass(tmp_path: Path) -> None:
    job = statelog.open(tmp_path.as_uri())
    try:
        assert job.writer_options == WriterOptions()
        w = job.writer
        assert w.options == WriterOptions()
        d = _defaults(WriterOptions)
        assert (w.persist_delay, w.flush_records, w.max_buffered_records, w.max_inflight_bytes, w.coalesce) == (
            d["persist_delay"], d["flush_records"], d["max_buffered_records"], d["max_inflight_bytes"], d["coalesce"]
        )
        assert w.retry == d["retry"] and w.encode_in_task is d["encode_in_task"]
    finally:
        job.close()


def test_every_writer_field_is_accepted_everywhere_and_nothing_else(tmp_path: Path) -> None:
    every = _defaults(WriterOptions)  # each field by name, with its default value
    url = (tmp_path / "root").as_uri()
    job = statelog.open(url, writer_options=every)
    assert job.writer_options == WriterOptions()
    job.close()
    env = StreamExecutionEnvironment(state_root=url, writer_options=every)
    assert env.config.writer_options == WriterOptions()
    message = r"unknown changelog writer option\(s\) \['persist_dealy'\]; valid: \['persist_delay', "
    for build in (
        lambda o: statelog.open(url, writer_options=o),
        lambda o: StreamExecutionEnvironment(state_root=url, writer_options=o),
        WriterOptions.from_mapping,
    ):
        with pytest.raises(ConfigError, match=message):
            build({"persist_dealy": 1})


def test_a_writer_options_object_is_taken_as_it_is(tmp_path: Path) -> None:
    options = WriterOptions(persist_delay="5ms", compression="lz4", coalesce=True)
    assert options.persist_delay == 0.005 and options.compression is Codec.LZ4
    job = statelog.open(tmp_path.as_uri(), writer_options=options)
    try:
        assert job.writer.options is options and job.writer.persist_delay == 0.005
    finally:
        job.close()
    with open_store(tmp_path.as_uri()) as store:
        w = ChangelogWriter(store, options)
        assert w.coalesce is True
        w.close()
    # the runtime ships it to its workers: it pickles and compares equal
    assert pickle.loads(pickle.dumps(options)) == options


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compression": "gzip"}, "compression must be one of zstd, lz4, none"),
        ({"coalesce": "yes"}, "coalesce must be True or False"),
        ({"columnar": 1}, "columnar must be True or False"),
        ({"retry": 3}, "retry must be a statelog.store.retry.RetryPolicy"),
        ({"compression_level": 99}, "compression_level: invalid count 99"),
    ],
)
def test_writer_options_refuse_wrong_kinds(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        WriterOptions(**kwargs)


def test_codecs_keep_their_persisted_names() -> None:
    assert [c.value for c in Codec] == list(BLOCK_CODECS) == ["zstd", "lz4", "none"]
    assert WriterOptions(compression=Codec.NONE) == WriterOptions(compression="none")


def test_materializer_defaults_come_from_the_dataclass(tmp_path: Path) -> None:
    root = tmp_path.as_uri()
    statelog.open(root).close()
    with open_store(root) as store:
        d = MaterializerDaemon(store)
        defaults = MaterializerOptions()
        assert d.settings == defaults
        assert (d.interval_s, d.max_tail_bytes, d.lease.ttl_s, d.gc_grace_s, d.retain_checkpoints, d.run_gc) == (
            defaults.interval_s, defaults.max_tail_bytes, defaults.lease_ttl_s, defaults.gc_grace_s, None, True
        )
        assert d.poll_s == min(5.0, defaults.interval_s) and d.gc_interval_s == max(defaults.interval_s, 60.0)
        # keyword arguments override an options object field by field
        d2 = MaterializerDaemon(store, MaterializerOptions(interval_s=7), max_tail_bytes="1KB")
        assert (d2.interval_s, d2.max_tail_bytes) == (7.0, 1024)


def test_every_materializer_field_is_accepted_everywhere_and_nothing_else(tmp_path: Path) -> None:
    every = _defaults(MaterializerOptions)
    url = tmp_path.as_uri()
    statelog.open(url).close()
    with open_store(url) as store:
        assert MaterializerDaemon(store, **every).settings == MaterializerOptions()
        with start_background(store, **every) as bg:
            assert bg.daemon.settings == MaterializerOptions()
    env = StreamExecutionEnvironment(state_root=url, materializer=every)
    assert env.config.materializer == MaterializerOptions()
    message = r"unknown materializer option\(s\) \['every'\]; valid: \['interval_s', "
    with open_store(url) as store:
        for build in (
            lambda o: MaterializerDaemon(store, **o),
            lambda o: start_background(store, **o),
            lambda o: StreamExecutionEnvironment(state_root=url, materializer=o),
            MaterializerOptions.from_mapping,
        ):
            with pytest.raises(ConfigError, match=message):
                build({"every": 2})


def test_the_cli_has_one_flag_per_materializer_option(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["materializer", "run", "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code == 0
    help_text = capsys.readouterr().out
    for f in dataclasses.fields(MaterializerOptions):
        assert re.search(rf"\s{re.escape(f.metadata['flag'])}\b", help_text), f.name
    flags = set(re.findall(r"\[(--[a-z-]+)", help_text))
    own = {"--help", "--verbose", "--store-option", "--json", "--once"}
    assert flags - own == {f.metadata["flag"] for f in dataclasses.fields(MaterializerOptions)}


def test_the_cli_builds_the_options_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path.as_uri()
    statelog.open(root).close()
    seen: list[MaterializerOptions] = []
    real = MaterializerDaemon.__init__

    def spy(self: MaterializerDaemon, store: Any, options: Any = None, **kw: Any) -> None:
        real(self, store, options, **kw)
        seen.append(self.settings)

    monkeypatch.setattr(MaterializerDaemon, "__init__", spy)
    code = main(["materializer", "run", "--once", root, "--interval", "2m", "--gc-interval", "3h",
                 "--owner", "cli-test"])
    assert code == 0
    code = main(["materializer", "run", "--once", root, "--interval", "90s", "--no-gc", "--owner", "cli-test"])
    assert code == 0
    assert seen == [MaterializerOptions(interval_s=120.0, gc_interval_s=3 * 3600.0, owner="cli-test"),
                    MaterializerOptions(interval_s=90.0, run_gc=False, owner="cli-test")]
