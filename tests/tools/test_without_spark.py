"""``pip install statelog`` without the ``spark`` extra: everything but Spark works.

A fresh interpreter with a meta-path hook that refuses every ``pyspark`` (and ``py4j``)
import stands in for an installation without PySpark.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor

REPO = Path(__file__).resolve().parents[2]

NO_SPARK = textwrap.dedent(
    """
    import sys

    class _NoSpark:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pyspark", "py4j"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoSpark())
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_SPARK + textwrap.dedent(code)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_pyspark_is_the_spark_extra_and_cloudpickle_a_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("<")[0].split("=")[0].strip() for d in project["dependencies"]]
    assert "pyspark" not in names and "cloudpickle" in names
    assert [d for d in project["optional-dependencies"]["spark"] if d.startswith("pyspark")]
    assert "spark" in (REPO / "Makefile").read_text().split("pip install --quiet -e '.[")[1].split("]")[0]


def test_engine_materializer_runtime_and_cli_import_and_run_without_pyspark() -> None:
    out = _run(
        """
        import importlib, pkgutil
        import statelog, materializer, runtime, tools.cli

        skipped = []
        for pkg in (statelog, materializer, runtime, tools):
            for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                if m.name == "statelog.spark" or m.name.startswith("statelog.spark."):
                    skipped.append(m.name)
                    continue
                if m.name.endswith(".__main__"):  # runs the CLI
                    continue
                importlib.import_module(m.name)
        assert skipped[:1] == ["statelog.spark"], skipped

        # lambdas in a job graph are shipped with cloudpickle, not PySpark's copy of it
        import pickle
        from runtime.cluster.master import serialize_graph
        graph = {"key_by": lambda r: r[0] * 2}
        assert pickle.loads(serialize_graph(graph))["key_by"]((21,)) == 42

        assert tools.cli.main(["--version"]) == 0
        assert not [m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j")]
        print("ok")
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_import_statelog_spark_names_the_extra() -> None:
    out = _run(
        """
        from statelog.errors import MissingDependencyError
        try:
            import statelog.spark
        except MissingDependencyError as e:
            assert isinstance(e, ImportError)
            print(e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'statelog[spark]'" in out.stdout and "PySpark" in out.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["sql", "SELECT 1", "--engine", "spark"],
        ["inspect", "--engine", "spark"],
        ["restore", "--checkpoint", "latest"],
        ["materializer", "run", "ROOT", "--once", "--engine", "spark"],
    ],
    ids=["sql-spark", "inspect-spark", "restore", "materializer-spark"],
)
def test_spark_commands_without_pyspark_exit_2_with_one_line(tmp_path: Path, args: list[str]) -> None:
    root = tmp_path.as_uri()
    job = statelog.open(root)
    b = job.backend("op")
    b.set_current_key("k")
    b.get_state(ValueStateDescriptor("count", pa.int64(), default=0)).update(1)
    job.checkpoint(sources={})
    job.close()
    argv = [root if a == "ROOT" else a for a in args] if "ROOT" in args else [args[0], root, *args[1:]]
    out = _run(
        f"""
        from tools.cli import main
        sys.exit(main({argv!r}))
        """
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("statelog: error: statelog.spark needs PySpark")
    assert "pip install 'statelog[spark]'" in lines[0]


def test_daemon_with_engine_spark_without_pyspark_names_the_extra(tmp_path: Path) -> None:
    statelog.open(tmp_path.as_uri()).close()
    out = _run(
        f"""
        from materializer.daemon.loop import MaterializerDaemon
        from statelog.errors import MissingDependencyError
        from statelog.store import open_store
        try:
            MaterializerDaemon(open_store({tmp_path.as_uri()!r}), engine="spark")
        except MissingDependencyError as e:
            print(e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'statelog[spark]'" in out.stdout
