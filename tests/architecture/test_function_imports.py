"""Imports live at the top of a module; an import inside a function needs a reason.

The reasons that count: an optional dependency (PySpark and what needs it, pandas), a heavy
import only one kind of root needs (minio for ``s3://``), and the import cycles and upward
imports still to be removed (listed so that they cannot grow; delete an entry when
its import goes).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("statelog", "materializer", "runtime", "tools")

# (module, imported module or its prefix) -> why the import is inside a function
ALLOWED: dict[tuple[str, str], str] = {
    # optional dependencies: the spark extra, pandas
    ("tools.cli.spark", "statelog.spark"): "the spark extra: the other commands work without PySpark",
    ("tools.cli.spark", "tools.sql.duckdb"): "DuckDB and the readers load when sql or inspect runs, not at start-up",
    ("tools.cli.spark", "statelog.readers"): "the readers load when sql or inspect runs, not at start-up",
    ("tools.cli.spark_session", "statelog.spark"): "the spark extra: the other commands work without PySpark",
    ("tools.cli.spark_session", "pyspark"): "the spark extra",
    ("tools.sql.spark", "statelog.spark"): "the spark extra: the Spark engine reads the statelog data sources",
    ("tools.sql.spark", "pyspark"): "the spark extra",
    ("tools.sql.spark", "statelog.readers"): "the readers load when the Spark engine runs, not at start-up",
    ("tools.sql.views", "statelog.readers"): "the readers load when sql or inspect runs, not at start-up",
    ("statelog.spark.schema", "pyspark.sql.pandas"): "needs pandas, which the spark extra does not install",
    ("statelog.loop_metrics", "statelog.loop_metrics_export"): "prometheus_client loads when a loop's metrics are served, not at start-up (and the exporter imports LoopMetrics)",
    # minio is imported for s3:// roots only
    # the store package chooses its implementation when a root is opened
    ("statelog.store", "statelog.store.local"): "open_store picks the implementation; at module level the package and its module would import each other",
    ("statelog.store", "statelog.store.s3"): "minio only for s3:// roots",
    ("statelog.spark.tasks", "pyspark"): "the spark extra",
    ("materializer.spark", "statelog.spark"): "the spark extra: SparkEngine fails at construction without it",
    ("materializer.daemon.loop", "materializer.spark"): "the spark extra: engine='spark' only",
    ("tools.cli.materializer", "statelog.spark"): "the spark extra: --engine spark only",
    ("tools.cli.materializer", "materializer.spark"): "the spark extra: --engine spark only",
    ("runtime.cluster.spark", "pyspark"): "the spark extra: cluster='spark' only; local jobs run without PySpark",
    # start-up time: a heavy import only the command that uses it pays
    ("tools.cli.ui", "tools.dashboard.page"): "start-up time: plotly only for `ui`",
    ("statelog.state_info", "statelog.types"): "start-up time: metadata is read without pyarrow, a state's "
                                                "value types are decoded when first used",
    ("tools.cli.checkpoint_json", "statelog.types"): "start-up time: `checkpoints list` prints no value types",
    ("statelog.query_client", "statelog.flight_client"): "start-up time: pyarrow.flight (gRPC) only for a grpc:// URL",
    ("materializer.daemon.metrics", "materializer.daemon.metrics_export"): "prometheus_client loads when a daemon's "
        "metrics are served, not when a background materializer starts (and the exporter imports DaemonMetrics)",
    ("statelog.state.timers", "sortedcontainers"): "start-up time: a backend's timers are sorted sets only once it has timers",
    ("statelog.state.tables.disk.directories", "tempfile"): "start-up time: tempfile and shutil (with bz2 and lzma) load "
                                                            "for a disk working set only",
    ("statelog.state.tables.disk.directories", "shutil"): "start-up time: as tempfile",
    ("materializer.daemon.gc_schedule", "materializer.gc.collect"): "start-up time: garbage collection's modules load "
                                                                     "at the first collection, not when a background materializer starts",
    ("statelog.job", "statelog.following.standby"): "start-up time: the follower's modules load for a standby "
                                                    "only, not when a writer opens its root",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def function_level_imports() -> list[tuple[str, int, str]]:
    """``(module, line, imported module)`` of every import inside a function (not TYPE_CHECKING)."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            mod = _module(path)
            tree = ast.parse(path.read_text(), str(path))
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        found += [(mod, node.lineno, a.name) for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        if node.level:
                            base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                            base = base[: len(base) - (node.level - 1)]
                            target = ".".join(base + ([node.module] if node.module else []))
                        else:
                            target = node.module or ""
                        found.append((mod, node.lineno, target))
    return found


def _allowed(mod: str, target: str) -> bool:
    return any(
        mod == m and (target == t or target.startswith(t + ".")) for m, t in ALLOWED
    )


def test_no_function_level_import_without_a_reason() -> None:
    unexplained = [f"{m}:{line} imports {t}" for m, line, t in function_level_imports() if not _allowed(m, t)]
    assert unexplained == [], "import at module level, or add the reason to ALLOWED"


def test_every_reason_still_has_its_import() -> None:
    found = {(m, t) for m, _, t in function_level_imports()}
    stale = [(mod, target) for mod, target in ALLOWED
             if not any(m == mod and (t == target or t.startswith(target + ".")) for m, t in found)]
    assert stale == [], "these imports are gone: delete their entries from ALLOWED"


def test_the_check_finds_a_function_level_import() -> None:
    found = function_level_imports()
    assert ("tools.cli.spark", "statelog.spark") in {(m, t) for m, _, t in found}


def test_version_comes_from_the_package_metadata() -> None:
    code = (
        "import importlib.metadata as md\n"
        "md.version = lambda name: '9.8.7' if name == 'statelog' else None\n"
        "import statelog, tools.cli\n"
        "print(statelog.__version__)\n"
        "tools.cli.main(['--version'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["9.8.7", "statelog", "9.8.7"]
