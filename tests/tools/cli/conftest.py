"""Fixtures of the table-width tests (``test_table_widths.py``, ``test_spark_table_widths.py``)."""

from __future__ import annotations

import pytest

from tests.support.table_widths import build_widths_root, record_cells


@pytest.fixture(scope="module")
def widths_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three operators with long names and big numbers, runtime statistics, a materialization
    and a savepoint: cells wide enough that 40 and 80 columns cannot show the tables as is."""
    return build_widths_root(tmp_path_factory)


@pytest.fixture
def table_cells(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every table cell the command adds (recorded at ``rich``'s ``Table.add_row``)."""
    return record_cells(monkeypatch)
