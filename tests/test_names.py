"""Names say one thing (issue 12): "compact" no longer names three things. The in-memory
record layouts are *narrow* / *wide*, dropping empty namespaces is *prune*, building a
materialization is *materialize* (``materializer/build.py``); no identifier in the code
says "compact"."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from statelog.changelog import records
from statelog.changelog.stream import ChangelogStream
from statelog.state.kinds import KeyedState

REPO = Path(__file__).resolve().parent.parent


def _identifiers(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name)
    return out


# RocksDB's own API (the disk-backed working set, statelog/state/tables/disk/): its compaction
# merges the database's sorted files, a fourth thing that is not ours to rename
THIRD_PARTY = {"DBCompactionStyle", "set_compaction_style", "compact_range"}


def test_no_identifier_says_compact():
    found = [
        f"{p.relative_to(REPO)}: {name}"
        for pkg in ("statelog", "materializer", "runtime", "tools", "bench", "examples")
        for p in sorted((REPO / pkg).rglob("*.py"))
        for name in sorted(_identifiers(p))
        if "compact" in name.lower() and name not in THIRD_PARTY
    ]
    assert found == []


def test_the_new_names():
    assert (records.NARROW_WIDTH, records.WIDE_WIDTH) == (5, 7)
    assert callable(records.narrow_columns)
    assert "narrow" in ChangelogStream.__init__.__code__.co_varnames
    assert callable(KeyedState.prune) and not hasattr(KeyedState, "compact")
    assert importlib.util.find_spec("materializer.build") is not None
    assert importlib.util.find_spec("materializer.compact") is None
