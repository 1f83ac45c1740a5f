"""What both exactly-once file sinks share: the two-phase commit of one transaction per checkpoint.

:class:`TwoPhaseCommitOperator` is the operator side of :class:`runtime.connectors.sinks.FileSink`
(a local directory, :class:`~runtime.connectors.sinks.FileSinkOperator`) and of its store-URL
variant (:class:`~runtime.connectors.object_sink.ObjectSinkOperator`): records are written as
JSON lines into the open transaction (an Arrow record batch: a line per row), the barrier of checkpoint ``n`` pre-commits it under
pending names (durable before the acknowledgement), and a completed checkpoint ``m >= n``
commits them. :func:`commits_on_recovery` is the rule of the job master's recovery: what a
restored checkpoint covers is committed, everything else aborted. Subclasses say where the
bytes go (:meth:`write_line`, :meth:`pre_commit`, :meth:`commit`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from runtime.task.operators import OperatorSnapshot, StreamOperator


def commits_on_recovery(checkpoint_id: int | None, committed_upto: int | None) -> bool:
    """Whether recovery from ``committed_upto`` commits a pending transaction of
    ``checkpoint_id`` (``None``: not a name the sink wrote); else it is aborted."""
    return checkpoint_id is not None and committed_upto is not None and checkpoint_id <= committed_upto


class TwoPhaseCommitOperator(StreamOperator):
    """A file sink subtask: transactions pre-committed at barriers, committed on completion."""

    name = "file-sink"

    def __init__(self, uid: str, serializer: Callable[[Any], str]) -> None:
        super().__init__(uid)
        self.serializer = serializer
        self._pending: list[tuple[int, str]] = []  # (checkpoint id, pending name), not yet committed

    def open(self) -> None:
        self.tag = f"{self.ctx.run_id[:8]}-a{self.ctx.attempt}"  # names never collide across attempts
        self.records = 0

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        if type(value) is pa.RecordBatch:  # a line per row, the row as a {column: value} dict
            serialize, write = self.serializer, self.write_line
            for row in value.to_pylist():
                write(serialize(row))
            self.records += value.num_rows
            return
        self.write_line(self.serializer(value))
        self.records += 1

    def snapshot(self, checkpoint_id: int) -> OperatorSnapshot | None:
        self._pending.extend((checkpoint_id, name) for name in self.pre_commit(checkpoint_id))
        return None

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        keep = []
        for cid, name in self._pending:
            if cid <= checkpoint_id:
                self.commit(name)
            else:
                keep.append((cid, name))
        self._pending = keep

    # -- where the bytes go ----------------------------------------------------------------

    def write_line(self, line: str) -> None:
        """Append one record's line (without the newline) to the open transaction."""
        raise NotImplementedError

    def pre_commit(self, checkpoint_id: int) -> list[str]:
        """Make the open transaction durable under pending names (none if it is empty)."""
        raise NotImplementedError

    def commit(self, name: str) -> None:
        """Commit one pending name, idempotently."""
        raise NotImplementedError
