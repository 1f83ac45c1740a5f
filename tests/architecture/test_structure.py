"""The file list shows the architecture: modules and classes stay small enough to read, and
every error name means one thing.

* A module has at most ``MODULE_LINES`` lines, unless a ``# size:`` comment in its first
  lines says why it is one piece.
* A class has at most ``CLASS_LINES`` lines, unless its docstring has a ``Size:`` line
  saying why.
* Every exception class name is defined once across the packages.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("statelog", "materializer", "runtime", "tools")
MODULE_LINES = 400
CLASS_LINES = 300
HEAD_LINES = 40  # where a module's "# size:" reason must be


def _modules() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def test_modules_are_small_or_say_why() -> None:
    big = []
    for path in _modules():
        lines = path.read_text().splitlines()
        if len(lines) > MODULE_LINES and not any(ln.startswith("# size:") for ln in lines[:HEAD_LINES]):
            big.append(_rel(path))
    assert big == [], f"modules over {MODULE_LINES} lines without a '# size:' reason at the top: {big}"


def test_classes_are_small_or_say_why() -> None:
    big = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if n > CLASS_LINES and not any(ln.startswith("Size:") for ln in doc.splitlines()):
                    big.append(f"{_rel(path)}:{node.name}")
    assert big == [], f"classes over {CLASS_LINES} lines without a 'Size:' line in the docstring: {big}"


def _is_exception(node: ast.ClassDef) -> bool:
    names = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
    return node.name.endswith(("Error", "Exception")) or any(n.endswith(("Error", "Exception")) for n in names)


def test_every_exception_name_is_defined_once() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and _is_exception(node):
                where[node.name].append(_rel(path))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"exception names defined more than once: {twice}"

