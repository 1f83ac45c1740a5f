"""Start-up stays light: ``import statelog`` and ``statelog --help`` load none of the heavy
optional dependencies (docs/performance.md, "Start-up"); ``statelog --help`` and ``statelog
checkpoints list`` on a file root load no pyarrow and nothing of the materializer.

Each check runs in a fresh interpreter and reads ``sys.modules`` after the import or the
``--help``: the package exports its names lazily (PEP 562) and the CLI imports what a
command needs when that command runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# top-level modules a start-up must not import: DataFrames, SQL, charts, RocksDB, S3, Spark
HEAVY = ("pandas", "duckdb", "plotly", "rocksdict", "minio", "pyspark")
# what `statelog --help` and `statelog checkpoints list` on a file:// root must not import
# either: Arrow (and NumPy), the materializer and its metrics, the compression of segments;
# `--help` also not rich (the tables of the commands)
CLI_HEAVY = (*HEAVY, "pyarrow", "numpy", "materializer", "prometheus_client", "zstandard")


def _heavy_modules_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    probe = code + (
        "\nimport json, sys\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(heavy)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_statelog_loads_no_heavy_dependency() -> None:
    assert _heavy_modules_after("import statelog") == []


def test_import_statelog_loads_no_engine_module() -> None:
    code = "import statelog, sys\nassert 'pyarrow' not in sys.modules and 'statelog.job' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_public_names_resolve_on_first_use() -> None:
    code = (
        "import statelog\n"
        "from statelog import ValueStateDescriptor, open\n"
        "assert open is statelog.open_job and statelog.StateJob.__name__ == 'StateJob'\n"
        "assert all(hasattr(statelog, name) for name in statelog.__all__)\n"
        "assert set(statelog.__all__) <= set(dir(statelog))\n"
        "print(ValueStateDescriptor.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ValueStateDescriptor"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    code = "import statelog\ntry:\n    statelog.no_such_name\nexcept AttributeError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "no attribute 'no_such_name'" in out.stdout


def test_cli_help_loads_no_heavy_dependency() -> None:
    code = (
        "import contextlib, io\n"
        "import tools.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert tools.cli.main(['--help']) == 0\n"
    )
    assert _heavy_modules_after(code) == []


def _cli_main(argv: list[str]) -> str:
    """Code that runs ``tools.cli.main(argv)`` (the console script without its exit) and checks its exit code."""
    return (
        "import contextlib, io\n"
        "import tools.cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    assert tools.cli.main({argv!r}) == 0\n"
        "assert out.getvalue(), 'the command printed nothing'\n"
    )


def test_cli_help_loads_no_command_module() -> None:
    """``statelog --help`` imports no command's dependencies: the parser names them only."""
    assert _heavy_modules_after(_cli_main(["--help"]), (*CLI_HEAVY, "rich")) == []


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_checkpoints_list_on_a_file_root_loads_no_arrow(tmp_path: Path, json_flag: list[str]) -> None:
    """``checkpoints list`` reads checkpoint metadata (JSON) from a file store: no pyarrow
    (a state's value types are decoded when first used), no materializer, no minio."""
    url = (tmp_path / "root").as_uri()
    make = f"import bench.startup\nbench.startup.make_list_root({url!r}, 10)\n"
    out = subprocess.run([sys.executable, "-c", make], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    code = _cli_main(["checkpoints", "list", url, *json_flag]) + "assert 'counts' in out.getvalue()\n"
    assert _heavy_modules_after(code, CLI_HEAVY) == []


def test_state_job_in_memory_loads_no_heavy_dependency() -> None:
    """A consumer loop's imports: statelog.open() and a backend in memory load no RocksDB."""
    code = (
        "import tempfile, pyarrow as pa, statelog\n"
        "root = tempfile.mkdtemp()\n"
        "job = statelog.open('file://' + root)\n"
        "b = job.backend('op', restore='none')\n"
        "s = b.get_state(statelog.ValueStateDescriptor('n', pa.int64(), default=0))\n"
        "b.set_current_key('k'); s.update(s.value() + 1)\n"
        "job.checkpoint()\n"
        "job.close()\n"
    )
    # without metrics_port nothing is served: no Prometheus client either
    assert _heavy_modules_after(code, (*HEAVY, "prometheus_client")) == []


def test_restore_and_first_record_load_no_pandas(tmp_path: Path) -> None:
    """A restarted consumer loop: restore a checkpoint of 2000 keys and update a key without
    importing pandas (pyarrow imports it on the first ``pa.array`` of a process)."""
    url = (tmp_path / "root").as_uri()
    make = (
        "import sys, bench.startup\n"
        f"bench.startup.make_list_root({url!r}, 2000)\n"
    )
    out = subprocess.run([sys.executable, "-c", make], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    code = (
        "import pyarrow as pa, statelog\n"
        f"job = statelog.open({url!r})\n"
        "b = job.backend('counts', restore=job.latest_checkpoint())\n"
        "s = b.get_state(statelog.ValueStateDescriptor('count', pa.int64(), default=0))\n"
        "b.set_current_key(7); s.update(s.value() + 1)\n"
        "assert s.value() == 4, s.value()\n"
        "job.close(flush=False)\n"
    )
    assert _heavy_modules_after(code) == []


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_runtime_application_imports_no_cluster_module() -> None:
    """``from runtime import Application`` (a consumer loop) loads runtime.app and what it
    needs, not the job master, the workers, the tasks, the network or the connectors."""
    code = (
        "import json, sys\n"
        "from runtime import Application\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('runtime.') and not m.startswith('runtime.app'))))\n"
    )
    assert json.loads(_run(code).splitlines()[-1]) == []


def test_runtime_names_resolve_on_first_use() -> None:
    code = (
        "import runtime\n"
        "from runtime import JobClient, StreamExecutionEnvironment\n"
        "assert runtime.JobClient is JobClient and StreamExecutionEnvironment.__name__ == 'StreamExecutionEnvironment'\n"
        "assert all(hasattr(runtime, name) for name in runtime.__all__)\n"
        "assert set(runtime.__all__) <= set(dir(runtime))\n"
        "try:\n"
        "    runtime.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    assert "module 'runtime' has no attribute 'no_such_name'" in _run(code)


def test_consumer_loop_start_loads_no_heavy_dependency(tmp_path: Path) -> None:
    """The guide's loop on a ``file://`` root up to its first record: statelog.open, a backend,
    the background materializer (its own handle on the root: no S3 client for a file root)."""
    code = (
        "import pyarrow as pa, statelog, materializer\n"
        f"job = statelog.open({(tmp_path / 'root').as_uri()!r})\n"
        "b = job.backend('op', restore='none')\n"
        "bg = materializer.start_background(job)\n"
        "s = b.get_state(statelog.ValueStateDescriptor('n', pa.int64(), default=0))\n"
        "b.set_current_key('k'); s.update(s.value() + 1)\n"
        "bg.stop(); job.close()\n"
    )
    assert _heavy_modules_after(code) == []


def test_consumer_loop_start_loads_no_metrics_client_and_no_follower(tmp_path: Path) -> None:
    """Up to its first record, a loop without ``metrics_port`` (and its background materializer
    without one) imports no ``prometheus_client``, and a writer's ``statelog.open`` none of the
    hot standby's follower modules: neither is on the path to the first record."""
    code = (
        "import json, sys, pyarrow as pa, statelog, materializer\n"
        f"job = statelog.open({(tmp_path / 'root').as_uri()!r})\n"
        "b = job.backend('op', restore='none')\n"
        "bg = materializer.start_background(job)\n"
        "s = b.get_state(statelog.ValueStateDescriptor('n', pa.int64(), default=0))\n"
        "b.set_current_key('k'); s.update(s.value() + 1)\n"
        "job.checkpoint(); bg.trigger()\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client'\n"
        "                or m in ('statelog.following.standby', 'statelog.following.follower'))\n"
        "bg.stop(); job.close()\n"
        "print(json.dumps(loaded))\n"
    )
    assert json.loads(_run(code).splitlines()[-1]) == []


def test_consumer_loop_first_checkpoint_loads_no_pandas(tmp_path: Path) -> None:
    """A restarted loop's first checkpoint (restore, updates, ``job.checkpoint``) in the loop's
    own thread imports no pandas (pyarrow would on a ``pa.array`` or ``to_numpy``)."""
    url = (tmp_path / "root").as_uri()
    out = subprocess.run([sys.executable, "-c", f"import bench.startup\nbench.startup.make_list_root({url!r}, 500)\n"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    code = (
        "import pyarrow as pa, statelog\n"
        f"job = statelog.open({url!r})\n"
        "b = job.backend('counts', restore=job.latest_checkpoint())\n"
        "s = b.get_state(statelog.ValueStateDescriptor('count', pa.int64(), default=0))\n"
        "for k in range(0, 1000, 3):\n"
        "    b.set_current_key(k); s.update(s.value() + 1)\n"
        "meta = job.checkpoint(sources={'input': {0: 4000}})\n"
        "assert meta.checkpoint_id == 4, meta.checkpoint_id\n"
        "job.close()\n"
    )
    assert _heavy_modules_after(code) == []


def test_background_materialization_of_the_first_checkpoint_loads_no_pandas(tmp_path: Path) -> None:
    """A restarted loop's background materializer writes its first checkpoint's tables (a value
    state: base rows and change records merged, Parquet row groups) without importing pandas:
    an import of ~0.5 s in the materializer's thread would hold up the loop's records."""
    url = (tmp_path / "root").as_uri()
    out = subprocess.run([sys.executable, "-c", f"import bench.startup\nbench.startup.make_list_root({url!r}, 500)\n"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    code = (
        "import pyarrow as pa, statelog, materializer\n"
        f"job = statelog.open({url!r})\n"
        "b = job.backend('counts', restore=job.latest_checkpoint())\n"
        "bg = materializer.start_background(job)\n"
        "s = b.get_state(statelog.ValueStateDescriptor('count', pa.int64(), default=0))\n"
        "for k in range(0, 1000, 3):\n"
        "    b.set_current_key(k); s.update(s.value() + 1)\n"
        "job.checkpoint(sources={'input': {0: 4000}})\n"
        "bg.trigger()\n"  # the forced cycle or the daemon's own poll before it materializes 4
        "assert job.latest_materialization().checkpoint_id == 4\n"
        "bg.stop(); job.close()\n"
    )
    assert _heavy_modules_after(code) == []


@pytest.mark.parametrize("keys", ["strings", "ints"])
def test_first_record_after_a_restore_loads_no_arrow_compute(tmp_path: Path, keys: str) -> None:
    """A restarted loop's first record loads its key group (materialized rows and the changelog
    tail: selected, decoded and checked in numpy) without importing ``pyarrow.compute`` (with
    the ``pydoc`` it imports, ~0.04 s of a restart) nor the sorted sets of timers."""
    url = (tmp_path / "root").as_uri()
    key = "f'user-{i}'" if keys == "strings" else "i"
    make = (
        "import pyarrow as pa, statelog, materializer\n"
        f"job = statelog.open({url!r})\n"
        "b = job.backend('counts', restore='none')\n"
        "s = b.get_state(statelog.ValueStateDescriptor('count', pa.int64(), default=0))\n"
        "def run(n):\n"
        "    for i in range(n):\n"
        f"        b.set_current_key({key}); s.update(s.value() + 1)\n"
        "bg = materializer.start_background(job)\n"
        "run(3000); job.checkpoint(sources={'input': {0: 3000}})\n"
        # the daemon's own poll may materialize checkpoint 1 before the forced cycle (which then
        # finds nothing new): check the published materialization, not the forced cycle's summary
        "bg.trigger(); assert job.latest_materialization().checkpoint_id == 1\n"
        "run(500); job.checkpoint(sources={'input': {0: 3500}})\n"
        "bg.stop(); job.close()\n"
    )
    _run(make)
    first = "'user-7'" if keys == "strings" else "7"
    code = (
        "import json, sys, pyarrow as pa, statelog\n"
        f"job = statelog.open({url!r})\n"
        "b = job.backend('counts', restore=job.latest_checkpoint())\n"
        "s = b.get_state(statelog.ValueStateDescriptor('count', pa.int64(), default=0))\n"
        f"b.set_current_key({first}); s.update(s.value() + 1)\n"
        "assert s.value() == 3, s.value()\n"
        "loaded = sorted(m for m in ('pyarrow.compute', 'sortedcontainers', 'pandas') if m in sys.modules)\n"
        "job.close(flush=False)\n"
        "print(json.dumps(loaded))\n"
    )
    assert json.loads(_run(code).splitlines()[-1]) == []
