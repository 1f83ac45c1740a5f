"""What a restore reads for a checkpoint and a key-group range."""

from __future__ import annotations

from statelog.changelog.format import TIMER_STATES
from statelog.checkpoint import ChangelogRange
from statelog.restore.changes import BaseFile

__all__ = ["split_timers"]


def split_timers(
    files: list[BaseFile], ranges: list[ChangelogRange]
) -> tuple[list[BaseFile], list[ChangelogRange], list[BaseFile], list[ChangelogRange]]:
    """``(timer files, timer ranges, other files, other ranges)``: each state has its own
    changelog stream, named ``<prefix>/<state name>`` (docs/format.md 4.7)."""

    def is_timer_range(r: ChangelogRange) -> bool:
        return r.stream.rsplit("/", 1)[-1] in TIMER_STATES

    return (
        [f for f in files if f[0].name in TIMER_STATES],
        [r for r in ranges if is_timer_range(r)],
        [f for f in files if f[0].name not in TIMER_STATES],
        [r for r in ranges if not is_timer_range(r)],
    )
