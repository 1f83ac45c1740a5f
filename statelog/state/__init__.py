"""Keyed state kinds (value, list, map, reducing, aggregating) and timers, kept in memory."""

from statelog.state.kinds import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from statelog.state.timers import Timer, TimerService

__all__ = [
    "AggregatingState",
    "ListState",
    "MapState",
    "ReducingState",
    "Timer",
    "TimerService",
    "ValueState",
]
