"""Options that contradict each other, or that have no effect without another, are refused:
exit code 2, one line on stderr naming both flags, before anything is read, served or written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor
from tools.cli import main


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = (tmp_path_factory.mktemp("contra") / "root").as_uri()
    job = statelog.open(url)
    b = job.backend("op")
    b.set_current_key("k")
    b.get_state(ValueStateDescriptor("count", pa.int64())).update(1)
    job.checkpoint(sources={})
    job.close()
    return url


RUN = ["materializer", "run", "ROOT", "--once"]
CASES = [
    (RUN + ["--spark-master", "local[1]"], "--spark-master applies only with --engine spark; drop --spark-master, "
     "or add --engine spark"),
    (RUN + ["--engine", "in-process", "--spark-master", "local[1]"], "--spark-master applies only with --engine spark"),
    (RUN + ["--metrics-host", "0.0.0.0"], "--metrics-host applies only with --metrics-port; drop --metrics-host, "
     "or add --metrics-port PORT"),
    (RUN + ["--no-gc", "--gc-grace", "1m"], "--gc-grace applies only with garbage collection, which --no-gc turns "
     "off; drop --gc-grace, or drop --no-gc"),
    (RUN + ["--no-gc", "--gc-interval", "5m"], "--gc-interval applies only with garbage collection"),
    (RUN + ["--no-gc", "--retain", "3"], "--retain applies only with garbage collection"),
    (["ui", "ROOT", "--out", ""], "--out: expected a file name for the page, got an empty one"),
    (["ui", "ROOT", "--out", "  "], "--out: expected a file name for the page, got an empty one"),
    (["ui", "ROOT", "--json", "--out", "OUT"], "--json prints the data and --out writes the page: give one of them"),
    (["ui", "ROOT", "--out", "OUT", "--port", "9000"], "--port applies when the page is served; drop --port, or "
     "drop --out"),
    (["ui", "ROOT", "--json", "--host", "0.0.0.0"], "--host applies when the page is served; drop --host, or "
     "drop --json"),
    (["inspect", "ROOT", "--no-count", "--engine", "duckdb"], "--engine chooses the engine that counts rows, and "
     "--no-count counts none"),
    (["inspect", "ROOT", "--no-count", "--master", "local[1]"], "--master chooses the engine that counts rows"),
    (["sql", "ROOT", "SELECT 1", "--engine", "duckdb", "--master", "local[1]"], "--master applies to --engine spark "
     "only"),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(a[:1] + a[2:]) for a, _ in CASES])
def test_contradictory_options_are_refused(root: str, tmp_path: Path, argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "page.html"
    argv = [root if a == "ROOT" else str(out_file) if a == "OUT" else a for a in argv]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("statelog: error: ") and message in err, err
    assert not out_file.exists()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_flags_are_accepted_with_what_they_apply_with(root: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["materializer", "run", root, "--once", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                 "--gc-grace", "1m", "--retain", "3", "--gc-interval", "2m"]) == 0
    out_file = tmp_path / "page.html"
    assert main(["ui", root, "--out", str(out_file)]) == 0 and out_file.stat().st_size > 0
    assert main(["inspect", root, "--no-count"]) == 0
    capsys.readouterr()
