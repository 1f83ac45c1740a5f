"""Operations of change records: the persisted codes, each named once (docs/format.md 4.5).

The codes are stored in the ``op`` column of every changelog block: never renumber them; a
new operation needs a new segment version. What each operation does to an entry of a state
is written once, in :mod:`statelog.restore.appliers` (used by the backend's restore and by the
materializer); the change feed shows :attr:`Op.label`.
"""

from __future__ import annotations

from enum import IntEnum


class Op(IntEnum):
    """The operation of a change record (after Flink's ``StateChangeOperation``)."""

    PUT = 1  # value/reducing/aggregating: set the value of (key, namespace)
    DELETE = 2  # any state: remove (key, namespace) entirely
    LIST_APPEND = 3  # list: append the elements in ``value`` (a list)
    LIST_REPLACE = 4  # list: replace the list with ``value`` (a list)
    MAP_PUT = 5  # map: put ``user_key`` -> ``value``
    MAP_REMOVE = 6  # map: remove ``user_key``
    TIMER_ADD = 7  # timers: add the timer at timestamp ``value``
    TIMER_REMOVE = 8  # timers: remove the timer at timestamp ``value``

    @property
    def label(self) -> str:
        """The name in docs/format.md and in the change feed: ``put``, ``list_append``, ..."""
        return self.name.lower()


_LABELS = {op.value: op.label for op in Op}


def op_label(code: int) -> str:
    """The label of a stored op code; an unknown code is shown as its number."""
    label = _LABELS.get(code)
    return str(code) if label is None else label


# Ops that replace everything earlier for the same (state, key, namespace) (coalescing).
OVERWRITING_OPS = frozenset({Op.PUT, Op.DELETE, Op.LIST_REPLACE})
