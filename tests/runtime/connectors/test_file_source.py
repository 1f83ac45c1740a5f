"""FileSource reads the files its ``pattern`` names; a directory in which no file matches is
an error naming the directory and the pattern (never a source that reads nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime import FileSink, FileSource, StreamExecutionEnvironment
from runtime.errors import JobGraphError
from statelog.errors import ConfigError


def _write(path: Path, records: list[dict[str, int]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_pattern_selects_the_files(tmp_path: Path) -> None:
    _write(tmp_path / "a.json", [{"n": 1}])
    _write(tmp_path / "b.json", [{"n": 2}])
    _write(tmp_path / "c.jsonl", [{"n": 3}])
    assert FileSource(tmp_path, pattern="*.json").splits() == ["a.json", "b.json"]
    assert FileSource(tmp_path).splits() == ["c.jsonl"]  # the default pattern: *.jsonl
    assert FileSource(tmp_path, "*").splits() == ["a.json", "b.json", "c.jsonl"]


def test_no_matching_file_is_an_error_naming_directory_and_pattern(tmp_path: Path) -> None:
    _write(tmp_path / "clicks.json", [{"n": 1}])
    with pytest.raises(ConfigError) as e:
        FileSource(tmp_path).check()
    msg = str(e.value)
    assert str(tmp_path) in msg and "'*.jsonl'" in msg  # what was expected
    assert "clicks.json" in msg  # what was found
    assert "pattern=" in msg  # what to do


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(JobGraphError, match="has no files"):
        FileSource(tmp_path, pattern="*.csv").splits()


@pytest.mark.parametrize("pattern", ["", None, 3])
def test_bad_pattern(tmp_path: Path, pattern: object) -> None:
    with pytest.raises(JobGraphError, match="pattern must be a non-empty glob"):
        FileSource(tmp_path, pattern=pattern)  # type: ignore[arg-type]


def test_job_fails_before_its_first_attempt(tmp_path: Path) -> None:
    """The job fails at once with the source's error, not after its restarts."""
    src = tmp_path / "in"
    src.mkdir()
    _write(src / "clicks.json", [{"n": 1}])
    env = StreamExecutionEnvironment(state_root=(tmp_path / "root").as_uri(), checkpoint_interval_s=None)
    env.from_source(FileSource(src), uid="src").sink_to(FileSink(tmp_path / "out"), uid="out")
    with pytest.raises(JobGraphError, match=r"no file in .* matches the pattern '\*\.jsonl'"):
        env.execute("no-match", timeout_s=120)


def test_pattern_job_reads_json_files(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    _write(src / "a.json", [{"n": i} for i in range(5)])
    env = StreamExecutionEnvironment(state_root=(tmp_path / "root").as_uri(), checkpoint_interval_s=None)
    env.from_source(FileSource(src, pattern="*.json"), uid="src").map(lambda r: r["n"]).sink_to(
        FileSink(tmp_path / "out"), uid="out")
    result = env.execute("json", timeout_s=120)
    assert result.attempts == 1
    rows = [json.loads(line) for p in (tmp_path / "out").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert sorted(rows) == list(range(5))
