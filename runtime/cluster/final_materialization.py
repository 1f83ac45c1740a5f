"""A finished job's last materialization, before its final checkpoint.

When every source of a bounded job has finished and the job master runs a background
materializer (``materializer=`` with ``materialize_before_final``, the default), the master
holds the final checkpoint back until it has:

1. taken one more checkpoint, which covers all input (its id is at least the coordinator's
   next id when the sources finished);
2. had the materializer materialize it (a forced cycle, in a thread: the master goes on
   polling its workers meanwhile);
3. told every worker to adopt the newest materialization now (``("adopt",)``, sent before
   the final checkpoint's trigger on the same connection).

So the final checkpoint builds on a materialization of (nearly) all of its state: restoring
or querying the finished job reads Parquet tables instead of replaying its changelog. The
job never depends on it: a failed, refused (another daemon leads) or slow cycle (over
``timeout_s``) is logged and the final checkpoint is taken on the current base.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

log = logging.getLogger(__name__)


class _Trigger(Protocol):
    def trigger(self, timeout: float = ...) -> dict[str, Any]: ...


class _Coordinator(Protocol):
    next_id: int

    def trigger_soon(self) -> None: ...


class Stage(Enum):
    IDLE = "idle"  # the sources have not all finished
    CHECKPOINTING = "checkpointing"  # waiting for a checkpoint that covers all input
    MATERIALIZING = "materializing"  # the forced materializer cycle runs
    DONE = "done"  # the final checkpoint may be taken


class FinalMaterialization:
    """The gate of the final checkpoint (:meth:`ready`, called by the coordinator)."""

    def __init__(
        self,
        materializer: _Trigger,
        coordinator: _Coordinator,
        last_completed: Callable[[], int | None],
        broadcast: Callable[[tuple[Any, ...]], None],
        timeout_s: float,
    ) -> None:
        self._materializer = materializer
        self._coordinator = coordinator
        self._last_completed = last_completed
        self._broadcast = broadcast
        self._timeout_s = timeout_s
        self.stage = Stage.IDLE
        self._covering_id = 0
        self._deadline = 0.0
        self._thread: threading.Thread | None = None
        self.summary: dict[str, Any] | None = None  # the forced cycle's summary, once it ran

    def ready(self) -> bool:
        """``True`` once the final checkpoint may be triggered (asked while none is pending)."""
        if self.stage is Stage.DONE:
            return True
        now = time.monotonic()
        if self.stage is Stage.IDLE:
            self.stage = Stage.CHECKPOINTING
            self._covering_id = self._coordinator.next_id
            self._deadline = now + self._timeout_s
            self._coordinator.trigger_soon()
            return False
        if now > self._deadline:
            log.warning(
                "the final materialization did not finish within %.0fs (%s); taking the final "
                "checkpoint on the current base", self._timeout_s, self.stage.value,
            )
            return self._done(adopt=False)
        if self.stage is Stage.CHECKPOINTING:
            last = self._last_completed()
            if last is None or last < self._covering_id:
                return False  # a failed one is triggered again at the checkpoint interval
            self.stage = Stage.MATERIALIZING
            self._thread = threading.Thread(target=self._run, name="statelog-final-materialization", daemon=True)
            self._thread.start()
            return False
        assert self._thread is not None
        if self._thread.is_alive():
            return False
        return self._done(adopt=self.summary is not None and self.summary.get("action") == "materialized")

    def _run(self) -> None:
        try:
            self.summary = self._materializer.trigger(timeout=max(1.0, self._deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - optional: logged, the job finishes on its base
            log.warning("the final materialization failed (%s); taking the final checkpoint on the current base", exc)
            return
        action = self.summary.get("action")
        if action != "materialized":
            log.info("the final materialization did not run (%s: %s)", action, self.summary.get("reason"))

    def _done(self, adopt: bool) -> bool:
        self.stage = Stage.DONE
        if adopt:
            self._broadcast(("adopt",))
        return True
