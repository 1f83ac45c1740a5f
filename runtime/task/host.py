"""What a task needs from the process that runs it (:class:`runtime.worker.process.Worker`)."""

from __future__ import annotations

from typing import Any, Protocol

from runtime.config import JobConfig


class TaskHost(Protocol):
    """What a task needs from the process that runs it (:class:`runtime.worker.process.Worker`):
    the job's configuration, the job master's pipe and the asynchronous part of checkpoints."""

    config: JobConfig
    batch_size: int  # records a source task reads per step

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send a message to the job master."""
        ...

    def acknowledge_async(
        self,
        checkpoint_id: int,
        task: str,
        pending: list[Any],
        sources: dict[str, Any] | None,
        stats: dict[str, Any],
        *,
        blob: tuple[str, bytes] | None = None,
        held: bool = False,
    ) -> None:
        """Run the asynchronous part of a checkpoint off the task thread, then acknowledge it."""
        ...

    def hold_async(self) -> None:
        """Pending snapshots exist from now on (unaligned: from the first barrier)."""
        ...

    def release_async(self) -> None:
        """The pending snapshots counted by :meth:`hold_async` were abandoned."""
        ...
