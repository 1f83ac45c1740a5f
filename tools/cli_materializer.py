"""``statelog materializer ...``: the materializer daemon (see ``docs/cli.md``)."""

from __future__ import annotations

from typing import Any


def register(commands: Any, command: Any) -> None:
    """Add the ``materializer`` command group (``command(group, name, handler, help)``)."""
