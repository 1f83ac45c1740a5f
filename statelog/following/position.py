"""The consistency levels of a follower and its position (what its state is the state of)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from statelog.errors import ConfigError

__all__ = ["Consistency", "FollowPosition", "Read", "check_consistency"]


class Consistency(enum.Enum):
    """What a follower's state is.

    ``CHECKPOINT``: the state of a completed checkpoint, moving only from one completed
    checkpoint to the next; ``FLUSHED``: that plus the changelog the writer flushed after it
    (fresher, but it can move back when the writer fails and restores an earlier checkpoint).
    """

    CHECKPOINT = "checkpoint"
    FLUSHED = "flushed"


def check_consistency(value: Any) -> Consistency:
    """The :class:`Consistency` named by ``value`` (its value string or the member)."""
    if isinstance(value, Consistency):
        return value
    for c in Consistency:
        if value == c.value:
            return c
    raise ConfigError(
        f"consistency must be one of {', '.join(repr(c.value) for c in Consistency)}, got {value!r}"
    )


@dataclass(frozen=True)
class FollowPosition:
    """Where a follower is.

    ``checkpoint_id``: the completed checkpoint its state is built on (``None`` before the
    root has one); ``flushed_records``: change records applied beyond that checkpoint
    (consistency ``"flushed"`` only; ``0``: the state is exactly the checkpoint's);
    ``lag_s``: now minus the checkpoint's timestamp; ``data_lag_s``: now minus the time of the
    newest change applied (the newest flushed segment's, else the checkpoint's);
    ``lag_checkpoints``: the newest published checkpoint id the follower saw minus
    ``checkpoint_id``; ``restores``: how often it restored a whole checkpoint (the first
    restore included).
    """

    checkpoint_id: int | None
    consistency: Consistency
    lag_s: float
    data_lag_s: float
    lag_checkpoints: int
    flushed_records: int
    restores: int

    @property
    def exact(self) -> bool:
        """The state is exactly that of checkpoint ``checkpoint_id`` (no flushed changes)."""
        return self.flushed_records == 0


@dataclass(frozen=True)
class Read:
    """A lookup's value and what the state it was read from is: checkpoint ``checkpoint_id``,
    plus ``flushed_records`` change records flushed after it (``0``: exactly the checkpoint)."""

    value: Any
    checkpoint_id: int | None
    flushed_records: int
