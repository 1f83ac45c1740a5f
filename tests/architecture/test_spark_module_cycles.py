"""The modules of statelog.spark import each other without a cycle (also none closed by a
function-level import): what the state rows and the change rows share is in
``statelog/spark/rows.py``, below both."""

from __future__ import annotations

import ast
from pathlib import Path

SPARK = Path(__file__).resolve().parents[2] / "statelog" / "spark"


def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in SPARK.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for m in mods:
        edges = set()
        for node in ast.walk(ast.parse((SPARK / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("statelog.spark."):
                    edges.add(node.module.split(".")[2])
                elif node.module == "statelog.spark":
                    edges.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.Import):
                edges.update(a.name.split(".")[2] for a in node.names if a.name.startswith("statelog.spark."))
        graph[m] = edges & mods - {m}
    return graph


def _reaches(graph: dict[str, set[str]], a: str, b: str) -> bool:
    seen, todo = set(), [a]
    while todo:
        m = todo.pop()
        for n in graph[m]:
            if n == b:
                return True
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return False


def test_no_import_cycle_in_statelog_spark():
    graph = _graph()
    assert [m for m in sorted(graph) if _reaches(graph, m, m)] == []


def test_state_rows_and_change_rows_share_rows_py():
    graph = _graph()
    assert "rows" in graph["datasource"] and "rows" in graph["changes"]
    assert "datasource" not in graph["changes"]
    assert graph["rows"] <= {"schema"}
