"""``statelog gc`` and ``statelog savepoint ...`` (see ``docs/cli.md``)."""

from __future__ import annotations

from typing import Any


def register(commands: Any, command: Any) -> None:
    """Add the ``gc`` and ``savepoint`` commands (``command(group, name, handler, help)``)."""
