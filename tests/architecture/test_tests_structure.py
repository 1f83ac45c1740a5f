"""The tests' own structure: a test module holds tests, code the tests share lives in
``tests/support/`` (or in a ``conftest.py`` fixture).

* No module under ``tests/`` imports a ``test_*`` module: a helper another test file needs
  moves to ``tests/support/``. Every import counts (module level and inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def imported_test_modules(source: str, package: list[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``source`` (a module of ``package``, e.g.
    ``["tests", "e2e"]``) that names a ``test_*`` module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            if node.level:
                base = package[: len(package) - node.level + 1] + base
            names = [".".join(base)] + [".".join([*base, a.name]) for a in node.names]
        else:
            continue
        if any(part.startswith("test_") for name in names for part in name.split(".")):
            found.append((node.lineno, next(n for n in names if "test_" in n)))
    return found


def test_no_test_module_imports_a_test_module() -> None:
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in imported_test_modules(path.read_text(), list(path.relative_to(REPO).parent.parts))
    ]
    assert bad == [], (
        "test modules import other test modules; move the shared helpers to tests/support/ "
        "(or a conftest.py fixture):\n" + "\n".join(bad)
    )


def test_the_rule_sees_every_import_form() -> None:
    source = (
        "from tests.support import jobs\n"
        "from tests.statelog.test_keys import x\n"
        "import tests.e2e.test_crash\n"
        "from .test_layout import y\n"
        "from . import test_envelope\n"
        "def f():\n"
        "    from tests.e2e import test_property\n"
        "from .. import support\n"
    )
    found = imported_test_modules(source, ["tests", "statelog"])
    assert found == [
        (2, "tests.statelog.test_keys"),
        (3, "tests.e2e.test_crash"),
        (4, "tests.statelog.test_layout"),
        (5, "tests.statelog.test_envelope"),
        (7, "tests.e2e.test_property"),
    ], found
