"""Turning a read-only keyed backend (a follower's replica, without changelog) into a writing
one in place: the hot standby's takeover (:mod:`statelog.following.standby`).

:func:`attach_changelog` gives every registered state and both timer domains a changelog
stream of the job's writer and makes the backend's checkpoints build on the checkpoint the
replica is exactly at (its materialized parts and changelog ranges, as a restore of that
checkpoint would), without touching a single entry: the takeover costs the same at 10^3 and
10^7 keys. :func:`~statelog.state.rebind.rebind` gives a registered state the caller's descriptor (its default, its
reduce or aggregate function) when the descriptor describes the same stored state
(it runs from ``get_state``).
"""

from __future__ import annotations

from typing import Any

from statelog.changelog.writer import ChangelogWriter
from statelog.restore.changes import RestoredChanges
from statelog.state.backend import KeyedStateBackend
from statelog.state.rebind import narrow_stream, rebind
from statelog.state.snapshot import CheckpointBase
from statelog.state.timers import TIMER_INFOS, _TimerLog

__all__ = ["attach_changelog"]


def attach_changelog(backend: KeyedStateBackend, writer: ChangelogWriter, stream_prefix: str,
                     base: RestoredChanges) -> None:
    """Make ``backend`` (without changelog, every key group loaded) write its changes to
    ``writer`` under ``stream_prefix``, its checkpoints building on ``base`` (what a restore of
    the checkpoint its state is exactly at would have planned: parts, inherited ranges, the
    checkpoint id; no entries). Its registered states keep their entries and may be asked for
    once with the caller's own descriptor (:func:`rebind`, from ``get_state``)."""
    backend.wait_loaded()
    backend.key_context.changelog_enabled = True
    backend._writer = writer
    backend._stream_prefix = stream_prefix
    for state in backend._states.values():
        rebind(state, state.descriptor, backend._open_stream(state.info, narrow_stream(state.info)))
    timers: Any = backend.timers
    timers._logs = (_TimerLog(backend._open_stream(TIMER_INFOS[0], True)),
                    _TimerLog(backend._open_stream(TIMER_INFOS[1], True)))
    backend._restored = base
    backend._installer.restored = base
    backend._checkpoints = CheckpointBase(backend.operator_uid, backend.subtask, backend.parallelism,
                                          backend.key_groups, backend._streams, base)
    backend.rebindable = set(backend._states)
