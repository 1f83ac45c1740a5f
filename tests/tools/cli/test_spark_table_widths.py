"""The tables of ``sql``, ``inspect`` (with row counts) and ``restore`` fit 40, 80 and 120
columns and a pipe without cutting a value (the checks are those of
``tests/tools/cli/test_table_widths.py``, in ``tests/support/table_widths.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.table_widths import WIDTHS, check_rendering, run_at, width_id

pytestmark = pytest.mark.slow  # a Spark session (shared by the module's tests)

QUERY = ("SELECT key, value, value * 1000003 AS big, CONCAT('sessionizer output of ', key, ' at 12.5 KiB') AS note, "
         "value / 7 AS ratio FROM per_user_counter__count_of_events_per_user_session ORDER BY key")


@pytest.mark.parametrize("width", WIDTHS, ids=width_id)
@pytest.mark.parametrize("name", ["sql", "sql-metadata", "inspect", "restore"])
def test_spark_command_tables_fit(spark: Any, widths_root: str, name: str, width: int, table_cells: list[str],
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    argv = {
        "sql": ["sql", widths_root, QUERY, "--key-type", "string"],
        "sql-metadata": ["sql", widths_root, "SELECT * FROM statelog_checkpoints"],
        "inspect": ["inspect", widths_root],
        "restore": ["restore", widths_root, "--checkpoint", "latest", "--parallelism", "2",
                    "--savepoint", f"widths-{width_id(width)}"],
    }[name]
    out = run_at(width, monkeypatch, capsys, argv)
    assert table_cells, "the command printed no table"
    check_rendering(out, table_cells, width)
