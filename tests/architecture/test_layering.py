"""Dependencies point down, and no module imports itself back through others.

Layers, bottom-up: ``statelog`` (the engine) <- ``materializer`` <- ``runtime`` and ``tools``.
A module may import from its own layer and the layers below, never above; ``runtime`` and
``tools`` do not import each other. Every import counts: module level, inside functions
and under ``if TYPE_CHECKING:``. Cycles between modules are refused the same way (an
import cycle closed by a function-level import is still a cycle of the design).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.imports import PACKAGES, import_cycles, import_graph

REPO = Path(__file__).resolve().parents[2]
# what each top-level package may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "statelog": frozenset(),
    "materializer": frozenset({"statelog"}),
    "runtime": frozenset({"statelog", "materializer"}),
    "tools": frozenset({"statelog", "materializer"}),
}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for mod, targets in sorted(graph.items()):
        layer = mod.split(".")[0]
        for t in sorted(targets):
            other = t.split(".")[0]
            if other != layer and other not in ALLOWED.get(layer, frozenset()):
                found.append(f"{mod} imports {t}")
    return found


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
