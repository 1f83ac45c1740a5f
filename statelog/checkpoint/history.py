"""The checkpoint history: every checkpoint's stats, failed ones too, in a bounded log.

Checkpoint metadata is dropped by retention (a job keeps its newest few checkpoints); the
history keeps one small entry per checkpoint attempt and per restart for much longer, so a
dashboard can chart hours of checkpoints (``docs/format.md`` section 12). The log lives below
``history/checkpoints/`` as rolled segments: one JSON envelope (``statelog.checkpoint-history``
v1, :mod:`statelog.envelope`) per line, each line verified on read. A segment holds at most
:data:`SEGMENT_ENTRIES` entries; when a new segment starts, the oldest are deleted so that at
most :data:`MAX_SEGMENTS` remain (a bounded size: about ``SEGMENT_ENTRIES * MAX_SEGMENTS``
entries of a few hundred bytes each).

Objects are write-once, so an append writes segment ``n`` anew under the key
``seg-<n>-<entries>.jsonl`` (its lines so far plus the new one) and then deletes the key with
one entry fewer; a reader takes, per segment number, the key with the most entries. The writer
is the root's one checkpoint publisher (the writer lease); an append never fails a checkpoint:
an error is logged and the entry is lost. :func:`read_history` returns the entries of every
verified line and one error per line or segment that fails verification.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from statelog import envelope
from statelog.errors import CorruptionError, ObjectNotFoundError, StatelogError
from statelog.layout import HISTORY_PREFIX
from statelog.layout import history_segment_key as segment_key
from statelog.layout import parse_history_segment_key as parse_segment_key
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

FORMAT = "statelog.checkpoint-history"
VERSION = 1
SEGMENT_ENTRIES = 256
MAX_SEGMENTS = 32

# what an entry's ``status`` says
COMPLETED, FAILED, RESTART = "completed", "failed", "restart"
# the numeric checkpoint stats copied into a completed entry when the publisher recorded them
ENTRY_STATS = (
    "duration_ms", "sync_ms", "async_ms", "alignment_ms", "incremental_bytes", "inflight_bytes",
    "source_records", "records_per_s", "attempt", "mode", "final", "watermark_ms", "kafka_lag",
)  # fmt: skip


def encode_entry(entry: Mapping[str, Any]) -> bytes:
    """One line of a segment: the entry as a checksummed envelope, newline-terminated."""
    return envelope.dump({"format": FORMAT, "version": VERSION, **entry}) + b"\n"


def decode_entry(line: bytes, key: str, number: int) -> dict[str, Any]:
    """The verified entry of line ``number`` (1-based) of segment ``key``."""
    body = envelope.load(
        line, f"{key} line {number}", "checkpoint history entry", fmt=FORMAT, versions=(VERSION,)
    )
    return {k: v for k, v in body.items() if k not in ("format", "version")}


class CheckpointHistory:
    """The appending side of the history of one job root (one writer: the checkpoint publisher)."""

    def __init__(
        self,
        store: ObjectStore,
        segment_entries: int = SEGMENT_ENTRIES,
        max_segments: int = MAX_SEGMENTS,
    ) -> None:
        self.store = store
        self.segment_entries = segment_entries
        self.max_segments = max_segments
        self._lock = threading.Lock()
        self._segment: int | None = (
            None  # the current segment's number and lines (read on first append)
        )
        self._lines: list[bytes] = []
        self.errors = 0  # appends that failed (logged)

    def append(self, entry: Mapping[str, Any]) -> bool:
        """Add ``entry`` (JSON-ready) to the log; ``False`` if it could not be written (logged)."""
        try:
            line = encode_entry({"time_ms": int(time.time() * 1000), **entry})
            with self._lock:
                self._append(line)
            return True
        except (StatelogError, OSError, TypeError, ValueError) as e:
            self.errors += 1
            log.warning(
                "checkpoint history: could not record %s: %s",
                dict(entry).get("status", "an entry"),
                e,
            )
            return False

    def record_checkpoint(self, checkpoint_id: int, stats: Mapping[str, Any], **extra: Any) -> bool:
        entry: dict[str, Any] = {"status": COMPLETED, "checkpoint_id": checkpoint_id}
        entry.update({k: stats[k] for k in ENTRY_STATS if k in stats})
        entry.update({k: v for k, v in extra.items() if v is not None})
        return self.append(entry)

    def record_failure(self, checkpoint_id: int | None, reason: str, **extra: Any) -> bool:
        entry = {"status": FAILED, "checkpoint_id": checkpoint_id, "reason": reason[:500]}
        return self.append({**entry, **{k: v for k, v in extra.items() if v is not None}})

    def record_restart(self, attempt: int, cause: str) -> bool:
        return self.append({"status": RESTART, "attempt": attempt, "cause": cause[:500]})

    def _append(self, line: bytes) -> None:
        if self._segment is None:  # continue the newest segment a previous writer left
            newest = _newest_segments(self.store)
            if newest:
                self._segment, key = newest[-1]
                self._lines = self.store.get(key).splitlines(keepends=True)
            else:
                self._segment, self._lines = 0, []
        if len(self._lines) >= self.segment_entries:
            self._segment += 1
            self._lines = []
        lines = [*self._lines, line]
        self.store.put(segment_key(self._segment, len(lines)), b"".join(lines))
        self._lines = lines
        for o in list(
            self.store.list(HISTORY_PREFIX)
        ):  # the shorter copies, the segments beyond the cap
            parsed = parse_segment_key(o.key)
            if parsed is not None and (
                parsed[0] <= self._segment - self.max_segments
                or (parsed[0] == self._segment and parsed[1] < len(lines))
            ):
                self.store.delete(o.key)


def _newest_segments(store: ObjectStore) -> list[tuple[int, str]]:
    """Per segment number (ascending), the key of its copy with the most entries."""
    best: dict[int, tuple[int, str]] = {}
    for o in store.list(HISTORY_PREFIX):
        parsed = parse_segment_key(o.key)
        if parsed is not None and parsed[1] > best.get(parsed[0], (-1, ""))[0]:
            best[parsed[0]] = (parsed[1], o.key)
    return [(n, key) for n, (_, key) in sorted(best.items())]


@dataclass
class HistoryRead:
    """What :func:`read_history` found: the verified entries (oldest first) and the errors."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    segments: int = 0


def read_history(store: ObjectStore, retries: int = 3) -> HistoryRead:
    """Every verified entry of the root's history; a corrupt line is skipped with an error."""
    out = HistoryRead()
    for _, key in _newest_segments(store):
        try:
            data = store.get(key)
        except (
            ObjectNotFoundError
        ):  # replaced by a longer copy or dropped while listing: read again
            return (
                read_history(store, retries - 1)
                if retries > 0
                else _failed(out, f"{key} changed while it was read")
            )
        except StatelogError as e:
            out.errors.append(f"{key}: {e}")
            continue
        out.segments += 1
        for number, line in enumerate(data.splitlines(), 1):
            try:
                out.entries.append(decode_entry(line, key, number))
            except CorruptionError as e:
                out.errors.append(str(e))
    return out


def _failed(out: HistoryRead, error: str) -> HistoryRead:
    out.errors.append(error)
    return out
