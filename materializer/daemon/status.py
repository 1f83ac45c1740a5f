"""The daemon's status object under the job root: its last cycle and its last error.

Each daemon (leader or standby) rewrites ``materializer/status/<hash of its owner name>.json``
after every cycle (``docs/format.md`` section 13): a JSON envelope
``statelog.materializer-status`` v1 with its owner, host and pid, the number of cycles, the
time and summary of the last cycle, and the last error with its time (kept until a later
cycle succeeds). ``statelog ui`` shows it next to the leader lease, so that the daemon's state
is visible from any host that reads the root, without reaching its metrics port. Writing it
never fails a cycle (an error is logged).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from statelog import envelope
from statelog.errors import CorruptionError, StatelogError
from statelog.layout import (
    MATERIALIZER_STATUS_PREFIX,
    is_materializer_status_key,
    materializer_status_key,
)
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

FORMAT = "statelog.materializer-status"
VERSION = 1
_CYCLE_FIELDS = ("action", "reason", "leader", "generation", "duration_s")


class StatusWriter:
    """Writes one daemon's status object after each cycle."""

    def __init__(self, store: ObjectStore, owner: str) -> None:
        self.store = store
        self.owner = owner
        self.key = materializer_status_key(owner)
        self.last_error: str | None = None
        self.last_error_ms: int | None = None
        self.last_success_ms: int | None = None

    def cycle_done(self, cycles: int, summary: dict[str, Any], error: BaseException | None) -> None:
        now = int(time.time() * 1000)
        if error is None:
            self.last_success_ms = now
            self.last_error = None
        else:
            self.last_error, self.last_error_ms = f"{type(error).__name__}: {error}"[:500], now
        mat = summary.get("materialization")
        body = {
            "format": FORMAT, "version": VERSION, "owner": self.owner, "host": socket.gethostname(),
            "pid": os.getpid(), "time_ms": now, "cycles": cycles,
            "last_cycle": {
                **{k: summary.get(k) for k in _CYCLE_FIELDS},
                "materialization": mat.get("id") if isinstance(mat, dict) else None,
                "failed": error is not None,
            },
            "last_success_ms": self.last_success_ms,
            "last_error": self.last_error, "last_error_ms": self.last_error_ms,
        }  # fmt: skip
        try:
            self.store.put(self.key, envelope.dump(body))
        except (StatelogError, OSError) as e:
            log.warning("materializer: could not write its status object %s: %s", self.key, e)


def read_statuses(store: ObjectStore) -> tuple[list[dict[str, Any]], list[str]]:
    """Every daemon's verified status (newest first) and the errors of unreadable ones."""
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    for o in store.list(MATERIALIZER_STATUS_PREFIX):
        if not is_materializer_status_key(o.key):
            continue
        try:
            out.append(
                envelope.load(
                    store.get(o.key), o.key, "materializer status", fmt=FORMAT, versions=(VERSION,)
                )
            )
        except (CorruptionError, StatelogError) as e:
            errors.append(str(e))
    out.sort(key=lambda s: -int(s.get("time_ms", 0)))
    return out, errors
