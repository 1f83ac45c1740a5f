"""Optional C accelerators (built from pyproject.toml; pure-Python fallbacks exist).

``STATELOG_PURE_PYTHON=1`` in the environment makes :func:`load` return ``None``, so every
caller uses its pure-Python reference implementation.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

FORCE_PYTHON = os.environ.get("STATELOG_PURE_PYTHON", "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The accelerator module ``name``, or ``None`` when it is not built or Python is forced."""
    if FORCE_PYTHON:
        return None
    try:
        return importlib.import_module(f"statelog._ext.{name}")
    except ImportError:  # not built (e.g. no compiler)
        return None


# The in-memory store's table of int keys (inttable.c: IntTable and its add_into and
# put_items), or None when it is not built or Python is forced: the tables are dicts then.
inttable = load("inttable")
IntTable: Any = getattr(inttable, "IntTable", None)


def plain_table(table: Any) -> Any:
    """``table``, or for an ``IntTable`` in dict mode the dict it keeps its entries in."""
    if type(table) is IntTable and table.dict() is not None:
        return table.dict()
    return table
