"""The state-dump baseline: checkpoints that write a subtask's whole keyed state.

``StreamExecutionEnvironment(state_backend=StateDumpBackend())`` runs the same job with the
statelog backend's changelog switched off (a :class:`runtime.SnapshotStrategy`); at every
barrier a keyed operator captures its state (:class:`bench.baselines.state_dump.CapturedState`:
shallow copies of the tables, on the task thread) and the snapshot pool serializes it
(format ``statelog.state-dump``, ``docs/format.md``) and writes it to
``full-snapshots/<uid>/<subtask>/<checkpoint>.snapshot`` under the job root (the object
layout of ``docs/format.md``). This is what a checkpoint costs without a changelog (Flink's
heap backend with full snapshots); ``python -m bench runtime`` compares it with statelog.

The checkpoints it takes are coordinated, timed and complete the sinks' transactions, but
they are not published as statelog checkpoints and cannot be restored (the state-dump format
has no timers and no TTL). A job with this backend runs without restarts and refuses
``restore=``.
"""

from __future__ import annotations

from bench.baselines.state_dump import CapturedState, encode_captured
from statelog.errors import CheckpointAbortedError
from statelog.layout import parse_state_dump_key, state_dump_dir, state_dump_key
from statelog.state.backend import KeyedStateBackend
from statelog.store.base import ObjectStore


class PendingStateDump:
    """One keyed backend's state dump: captured at creation, written by :meth:`result`."""

    def __init__(self, backend: KeyedStateBackend, checkpoint_id: int, store: ObjectStore) -> None:
        self.checkpoint_id = checkpoint_id
        self.key = state_dump_key(backend.operator_uid, backend.subtask, checkpoint_id)
        self.store = store
        self.captured: CapturedState | None = CapturedState(backend)
        self.nbytes = 0
        self._done = False

    def cancel(self) -> None:
        self.captured = None

    def result(self, timeout: float | None = None) -> None:
        captured, self.captured = self.captured, None
        if captured is None:
            if self._done:
                return None
            raise CheckpointAbortedError(f"state dump of checkpoint {self.checkpoint_id} was cancelled")
        data = encode_captured(captured)
        self.store.put(self.key, data)
        self.nbytes = len(data)
        self._done = True
        return None


def delete_older(store: ObjectStore, uid: str, subtask: int, completed: int) -> None:
    """Delete this subtask's state dumps of checkpoints before ``completed`` (best effort)."""
    for obj in store.list(state_dump_dir(uid, subtask)):
        parsed = parse_state_dump_key(obj.key)
        if parsed is not None and parsed[2] < completed:
            store.delete(obj.key)


class StateDumpBackend:
    """The ``state-dump`` snapshot strategy: a :class:`PendingStateDump` per keyed backend
    and checkpoint; a completed checkpoint deletes the subtask's older dumps."""

    name = "state-dump"

    def snapshot(self, backend: KeyedStateBackend, checkpoint_id: int, store: ObjectStore) -> PendingStateDump:
        return PendingStateDump(backend, checkpoint_id, store)

    def checkpoint_completed(self, backend: KeyedStateBackend, checkpoint_id: int, store: ObjectStore) -> None:
        delete_older(store, backend.operator_uid, backend.subtask, checkpoint_id)
