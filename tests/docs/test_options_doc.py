"""docs/options.md lists every field of every option object with its default.

Each option class has a section headed by its dotted name and a table ``| Field | Default |
Meaning |``; a row's default cell starts with the default as Python writes it in backticks
(an enum by its value, an option object at its defaults as ``ClassName()``), and may say
more after it (``(64 MiB)``). A field missing from the table, a wrong default or a row for a
field that does not exist fails.
"""

from __future__ import annotations

import enum
import re
from dataclasses import Field, fields
from pathlib import Path
from typing import Any

import pytest

from materializer.options import MaterializerOptions
from runtime.config import JobConfig
from statelog.materialization.table_writer import MaterializeOptions
from statelog.options.engine import WriterOptions
from statelog.restore.ondemand.options import OnDemandOptions

DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"
CLASSES = [WriterOptions, OnDemandOptions, MaterializeOptions, MaterializerOptions, JobConfig]
ROW = re.compile(r"^\| `(\w+)` \| `([^`]*)`[^|]* \| (.+) \|$")


def rendered(value: Any) -> str:
    """A default as the table writes it."""
    if isinstance(value, enum.Enum):
        return repr(value.value)
    try:
        if not isinstance(value, str | int | float | type(None)) and value == type(value)():
            return f"{type(value).__name__}()"
    except TypeError:  # no default constructor: its repr
        pass
    return repr(value)


def tables(text: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Section (the dotted class name of a ``## `...` `` heading) -> field -> (default, meaning)."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    section = None
    for line in text.splitlines():
        heading = re.match(r"^## `([\w.]+)`$", line)
        if heading:
            section = heading.group(1)
            out[section] = {}
        elif section is not None and (row := ROW.match(line)):
            out[section][row.group(1)] = (row.group(2), row.group(3))
    return out


def check(cls: type, table: dict[str, tuple[str, str]] | None) -> list[str]:
    if table is None:
        return [f"no section ## `{cls.__module__}.{cls.__name__}`"]
    problems = []
    declared: list[Field[Any]] = list(fields(cls))  # type: ignore[arg-type]
    for f in declared:
        if f.name not in table:
            problems.append(f"{cls.__name__}.{f.name} is missing")
        elif table[f.name][0] != rendered(f.default):
            problems.append(f"{cls.__name__}.{f.name}: the table says {table[f.name][0]}, the default is "
                            f"{rendered(f.default)}")
    problems += [f"{cls.__name__} has no field {name}" for name in sorted(set(table) - {f.name for f in declared})]
    return problems


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_in_the_table_with_its_default(cls: type) -> None:
    table = tables(DOC.read_text()).get(f"{cls.__module__}.{cls.__name__}")
    assert check(cls, table) == []


def test_the_check_sees_a_missing_field_a_wrong_default_and_an_extra_row() -> None:
    text = DOC.read_text()
    good = tables(text)["statelog.options.engine.WriterOptions"]
    broken = dict(good)
    del broken["persist_delay"]
    broken["upload_threads"] = ("3", "")
    broken["no_such_option"] = ("1", "")
    assert check(WriterOptions, broken) == [
        "WriterOptions.persist_delay is missing",
        "WriterOptions.upload_threads: the table says 3, the default is 2",
        "WriterOptions has no field no_such_option",
    ]
    assert check(WriterOptions, None) == ["no section ## `statelog.options.engine.WriterOptions`"]
