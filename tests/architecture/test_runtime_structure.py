"""The runtime package's structure: imports point down inside the package and
each name says one thing.

The import graph is tests/support/imports.py's (every import statement: module level, inside
functions and under ``if TYPE_CHECKING:``), so a back edge hidden in a function still fails.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from tests.support.imports import import_graph

REPO = Path(__file__).resolve().parents[2]


def runtime_imports() -> dict[str, set[str]]:
    """runtime module -> the runtime modules it imports (anywhere in its source)."""
    graph = import_graph(REPO, ["runtime"])
    return {mod: {d for d in deps if d.startswith("runtime")} for mod, deps in graph.items()}


# -- api, client, driver, task and worker import downwards (cycles: tests/architecture/test_layering.py)


def test_nothing_below_the_job_api_imports_it() -> None:
    graph = runtime_imports()
    importers = sorted(m for m, deps in graph.items() if "runtime.api.environment" in deps)
    assert importers == ["runtime"]  # only the package's public face re-exports it


def test_a_task_does_not_know_the_worker_that_hosts_it() -> None:
    graph = runtime_imports()
    assert "runtime.worker.process" not in graph["runtime.task.task"]
    assert "runtime.worker.process" not in graph["runtime.worker.deploy"]
    # the job configuration sits below everything that reads it
    assert graph["runtime.config"] <= {"runtime.errors"}


def test_the_job_configuration_keeps_its_public_names() -> None:
    import runtime
    from runtime.config import CHANGELOG, CheckpointingMode, JobConfig

    assert runtime.CheckpointingMode is CheckpointingMode
    assert JobConfig().state_backend == CHANGELOG
    assert JobConfig().mode is CheckpointingMode.EXACTLY_ONCE_ALIGNED


# -- JobCancelledError is a runtime error like the others -------------------------------


def test_job_cancelled_error_lives_with_the_runtime_errors() -> None:
    import runtime
    from runtime.errors import JobCancelledError, RuntimeJobError

    assert JobCancelledError.__module__ == "runtime.errors"
    assert runtime.JobCancelledError is JobCancelledError
    assert issubclass(JobCancelledError, RuntimeJobError)


# -- two timer classes, two names -------------------------------------------------------


def _class_definitions(name: str) -> list[str]:
    found = []
    for pkg in ("statelog", "materializer", "runtime", "tools"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            if any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(tree)):
                found.append(str(path.relative_to(REPO)))
    return found


def test_the_engine_and_the_runtime_name_their_timer_classes_apart(tmp_path: Path) -> None:
    import statelog
    from runtime.api.functions import ProcessContext, TimerContext
    from statelog.state.timers import TimerService

    assert _class_definitions("TimerService") == ["statelog/state/timers.py"]
    assert _class_definitions("TimerContext") == ["runtime/api/functions.py"]
    with statelog.open(tmp_path.as_uri()) as job:
        backend = job.backend("op", changelog=False)
        timers = ProcessContext(backend, 0, 1, "op").timer_service()
        assert isinstance(timers, TimerContext) and isinstance(backend.timers, TimerService)
        backend.set_current_key("k")
        timers.register_event_time_timer(5)  # the function's view writes the backend's timers
        assert backend.timers.next_timestamp("event") == 5


# -- deploying a worker's tasks is its own module ---------------------------------------


def test_worker_module_stays_small_and_deploy_is_apart() -> None:
    lines = (REPO / "runtime" / "worker" / "process.py").read_text().count("\n")
    assert lines < 500
    deploy = importlib.import_module("runtime.worker.deploy")
    assert callable(deploy.build_tasks)
