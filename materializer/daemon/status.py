"""The daemon's status object under the job root: its last cycle and its last error.

Each daemon (leader or standby) writes
``materializer/status/<hash of its owner name>-<time_ms>.json`` after every cycle and then
deletes the one it wrote before (objects are write-once; ``docs/format.md`` section 13): a JSON envelope
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
from statelog.errors import CorruptionError, ObjectNotFoundError, StatelogError
from statelog.layout import (
    MATERIALIZER_STATUS_PREFIX,
    materializer_status_key,
    parse_materializer_status_key,
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
        self._hash = parse_materializer_status_key(materializer_status_key(owner, 0))[0]  # type: ignore[index]
        self.key: str | None = None  # the newest status object this writer wrote
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
        key = materializer_status_key(self.owner, max(now, self._last_ms() + 1))
        try:
            self.store.put(key, envelope.dump(body))
        except (StatelogError, OSError) as e:
            log.warning("materializer: could not write its status object %s: %s", key, e)
            return
        stale = [self.key] if self.key is not None else self._older(key)
        self.key = key
        for old in stale:  # a leftover is harmless: readers take the newest per owner
            try:
                self.store.delete(old)
            except (StatelogError, OSError) as e:
                log.warning("materializer: could not delete its older status object %s: %s", old, e)

    def _last_ms(self) -> int:
        parsed = parse_materializer_status_key(self.key) if self.key is not None else None
        return parsed[1] if parsed is not None else 0

    def _older(self, key: str) -> list[str]:
        """The status objects an earlier daemon of the same name left (once, at the first write)."""
        try:
            return [o.key for o in self.store.list(MATERIALIZER_STATUS_PREFIX)
                    if o.key != key and (p := parse_materializer_status_key(o.key)) is not None
                    and p[0] == self._hash]
        except (StatelogError, OSError) as e:
            log.warning("materializer: could not list older status objects: %s", e)
            return []


def read_statuses(store: ObjectStore) -> tuple[list[dict[str, Any]], list[str]]:
    """Every daemon's verified status (newest first) and the errors of unreadable ones."""
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    newest = _newest(store)
    for _ in range(2):  # a daemon may replace its object between the listing and the read
        gone: dict[str, str] = {}
        for owner_hash, key in newest.items():
            try:
                out.append(
                    envelope.load(store.get(key), key, "materializer status", fmt=FORMAT, versions=(VERSION,))
                )
            except ObjectNotFoundError:
                gone[owner_hash] = key
            except (CorruptionError, StatelogError) as e:
                errors.append(str(e))
        newest = {h: k for h, k in _newest(store).items() if h in gone and k != gone[h]}
        if not newest:
            break
    out.sort(key=lambda s: -int(s.get("time_ms", 0)))
    return out, errors


def _newest(store: ObjectStore, only: set[str] | None = None) -> dict[str, str]:
    """Owner hash -> key of the newest status object of that daemon."""
    newest: dict[str, tuple[int, str]] = {}
    for o in store.list(MATERIALIZER_STATUS_PREFIX):
        parsed = parse_materializer_status_key(o.key)
        if parsed is not None and (only is None or parsed[0] in only) and parsed[1] >= newest.get(parsed[0], (-1, ""))[0]:
            newest[parsed[0]] = (parsed[1], o.key)
    return {h: k for h, (_, k) in newest.items()}
