"""Keyed state of one operator subtask: the backend (``backend.py``: keys and states;
``snapshot.py``: its checkpoints), the key context the states see (``context.py``), the state
kinds (``keyed.py``: their common part; ``kinds.py``: value, reducing, aggregating;
``containers.py``: list, map), timers (``timers.py``) and the stores of the entries
(``tables/``: memory and disk)."""

from statelog.state.containers import ListState, MapState
from statelog.state.kinds import AggregatingState, ReducingState, ValueState
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
