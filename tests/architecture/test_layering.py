"""Dependencies point down, and no module imports itself back through others.

Layers, bottom-up: ``statelog`` (the engine) <- ``materializer`` <- ``runtime`` and ``tools``.
A module may import from its own layer and the layers below, never above; ``runtime`` and
``tools`` do not import each other. Every import counts: module level, inside functions
and under ``if TYPE_CHECKING:``. Cycles between modules are refused the same way (an
import cycle closed by a function-level import is still a cycle of the design).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("statelog", "materializer", "runtime", "tools")
# what each top-level package may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "statelog": frozenset(),
    "materializer": frozenset({"statelog"}),
    "runtime": frozenset({"statelog", "materializer"}),
    "tools": frozenset({"statelog", "materializer"}),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module of ``modules`` that ``name`` (a module or a name in one) refers to."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (every import statement anywhere in it)."""
    files = {
        module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
    }
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".")
                    base = base if is_pkg else base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # "from pkg import sub" imports the module pkg.sub when there is one
                targets = [f"{prefix}.{a.name}" for a in node.names] or [prefix]
            for t in targets:
                target = _resolve(t, modules)
                if target is not None and target != mod:
                    edges.add(target)
        graph[mod] = edges
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for mod, targets in sorted(graph.items()):
        layer = mod.split(".")[0]
        for t in sorted(targets):
            other = t.split(".")[0]
            if other != layer and other not in ALLOWED.get(layer, frozenset()):
                found.append(f"{mod} imports {t}")
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    result.append(sorted(comp))
    return result


# A package's __init__ re-exports its modules for users; a module of the package importing
# a sibling through the package name is what creates a cycle, so __init__ edges count too.


def test_no_upward_imports() -> None:
    assert upward_imports(import_graph(REPO)) == []


def test_no_import_cycles() -> None:
    assert import_cycles(import_graph(REPO)) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_the_checker_finds_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The rules can fail: a synthetic tree with one upward import and one cycle."""
    _write(
        tmp_path,
        {
            "statelog/__init__.py": "",
            "statelog/a.py": """
                def f():
                    from materializer.m import g  # function-level upward import
                    return g
            """,
            "statelog/b.py": "from statelog import c\n",
            "statelog/c.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from statelog.b import X
            """,
            "materializer/__init__.py": "",
            "materializer/m.py": "from statelog.a import f\n",
            "runtime/__init__.py": "",
            "runtime/r.py": "from .s import y\n",
            "runtime/s.py": "import tools.cli\n",
            "tools/__init__.py": "",
            "tools/cli.py": "",
        },
    )
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == [
        "runtime.s imports tools.cli",
        "statelog.a imports materializer.m",
    ]
    assert import_cycles(graph) == [
        ["materializer.m", "statelog.a"],
        ["statelog.b", "statelog.c"],
    ]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_package_is_scanned(pkg: str) -> None:
    assert any(m == pkg or m.startswith(pkg + ".") for m in import_graph(REPO))
