"""The checkpoint history: every checkpoint's stats, failed ones too, in a bounded log.

Checkpoint metadata is dropped by retention (a job keeps its newest few checkpoints); the
history keeps one small entry per checkpoint attempt and per restart for much longer, so a
dashboard can chart hours of checkpoints (``docs/format.md`` section 12). The log lives below
``history/checkpoints/`` as rolled segments: one JSON envelope (``statelog.checkpoint-history``
v2, :mod:`statelog.envelope`) per line, each line verified on read. A segment holds at most
:data:`SEGMENT_ENTRIES` entries; when a new segment starts, the oldest are deleted so that at
most :data:`MAX_SEGMENTS` remain (a bounded size: about ``SEGMENT_ENTRIES * MAX_SEGMENTS``
entries of a few hundred bytes each).

Objects are write-once, so a flush writes segment ``n`` anew under the key
``seg-<n>-<entries>.jsonl`` (its lines so far plus the new ones) and then deletes the copy it
replaces; a reader takes, per segment number, the key with the most entries. The writer is
the root's one checkpoint publisher (the writer lease). Entries are buffered and written
together (two store requests per flush: the put and the delete): a flush happens when
:data:`FLUSH_ENTRIES` entries wait, :data:`FLUSH_INTERVAL_S` seconds after the oldest waiting
entry (a timer), at once for a failed checkpoint or a restart, and when the job closes. A
process that dies without closing loses the entries of its last ``FLUSH_INTERVAL_S`` seconds
at most. A write never fails a checkpoint: an error is logged and the entries are lost.
:func:`read_history` returns the entries of every verified line and one error per line or
segment that fails verification.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
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
VERSION = 2
READ_VERSIONS = (1, 2)  # v2 adds the consumer loop's fields (docs/format.md section 12)
SEGMENT_ENTRIES = 256
MAX_SEGMENTS = 32
FLUSH_ENTRIES = 16  # entries written together at most ...
FLUSH_INTERVAL_S = 5.0  # ... and at the latest this long after the oldest of them

# what an entry's ``status`` says
COMPLETED, FAILED, RESTART = "completed", "failed", "restart"
# the numeric checkpoint stats copied into a completed entry when the publisher recorded them
ENTRY_STATS = (
    "duration_ms", "sync_ms", "async_ms", "alignment_ms", "incremental_bytes", "inflight_bytes",
    "source_records", "records_per_s", "records_out", "attempt", "mode", "final", "watermark_ms", "kafka_lag",
)  # fmt: skip


def encode_entry(entry: Mapping[str, Any]) -> bytes:
    """One line of a segment: the entry as a checksummed envelope, newline-terminated."""
    return envelope.dump({"format": FORMAT, "version": VERSION, **entry}) + b"\n"


def decode_entry(line: bytes, key: str, number: int) -> dict[str, Any]:
    """The verified entry of line ``number`` (1-based) of segment ``key``."""
    body = envelope.load(
        line, f"{key} line {number}", "checkpoint history entry", fmt=FORMAT, versions=READ_VERSIONS
    )
    return {k: v for k, v in body.items() if k not in ("format", "version")}


class CheckpointHistory:
    """The appending side of the history of one job root (one writer: the checkpoint publisher).

    ``flush_entries`` and ``flush_interval_s`` bound the buffer (module docstring);
    ``flush_interval_s=0`` writes every entry at once."""

    def __init__(
        self,
        store: ObjectStore,
        segment_entries: int = SEGMENT_ENTRIES,
        max_segments: int = MAX_SEGMENTS,
        flush_entries: int = FLUSH_ENTRIES,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.store = store
        self.segment_entries = segment_entries
        self.max_segments = max_segments
        self.flush_entries = flush_entries
        self.flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        # the current segment's number, lines and key (read on the first flush)
        self._segment: int | None = None
        self._lines: list[bytes] = []
        self._key: str | None = None
        self._pending: list[tuple[str, bytes]] = []  # (status, line) not written yet
        self._timer: threading.Timer | None = None
        self._closed = False
        self.errors = 0  # flushes that failed (logged)

    def append(self, entry: Mapping[str, Any]) -> bool:
        """Add ``entry`` (JSON-ready) to the log (buffered, see the module docstring); ``False``
        if it could not be encoded or written (logged)."""
        status = str(dict(entry).get("status", "an entry"))
        try:
            line = encode_entry({"time_ms": int(time.time() * 1000), **entry})
        except (TypeError, ValueError) as e:
            self.errors += 1
            log.warning("checkpoint history: could not record %s: %s", status, e)
            return False
        with self._lock:
            self._pending.append((status, line))
            now = (
                self._closed or self.flush_interval_s <= 0 or status in (FAILED, RESTART)
                or len(self._pending) >= self.flush_entries
            )  # fmt: skip
            if not now:
                if self._timer is None:
                    self._timer = threading.Timer(self.flush_interval_s, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return True
        return self.flush()

    def flush(self) -> bool:
        """Write the waiting entries now; ``False`` if that failed (logged, the entries are lost)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            pending, self._pending = self._pending, []
            if not pending:
                return True
            try:
                self._write([line for _, line in pending])
                return True
            except (StatelogError, OSError) as e:
                self.errors += 1
                self._segment = None  # read the store again on the next flush
                statuses = ", ".join(dict.fromkeys(s for s, _ in pending))
                log.warning("checkpoint history: could not record %s (%d entries): %s", statuses, len(pending), e)
                return False

    def close(self) -> None:
        """Write the waiting entries (the job closes); later entries are written at once."""
        self.flush()
        self._closed = True

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

    def _write(self, new: list[bytes]) -> None:
        if self._segment is None:  # continue the newest segment a previous writer left
            listed = [o.key for o in self.store.list(HISTORY_PREFIX)]
            newest = _newest_segments(listed)
            if newest:
                self._segment, self._key = newest[-1]
                self._lines = self.store.get(self._key).splitlines(keepends=True)
                for key in listed:  # shorter copies a writer that died between put and delete left
                    parsed = parse_segment_key(key)
                    if parsed is not None and parsed[0] == self._segment and key != self._key:
                        self.store.delete(key)
            else:
                self._segment, self._lines, self._key = 0, [], None
        while new:
            if len(self._lines) >= self.segment_entries:  # roll: drop the segments beyond the cap
                self._segment += 1
                self._lines, self._key = [], None
                for o in list(self.store.list(HISTORY_PREFIX)):
                    parsed = parse_segment_key(o.key)
                    if parsed is not None and parsed[0] <= self._segment - self.max_segments:
                        self.store.delete(o.key)
            take = self.segment_entries - len(self._lines)
            lines = [*self._lines, *new[:take]]
            new = new[take:]
            key = segment_key(self._segment, len(lines))
            self.store.put(key, b"".join(lines))
            previous, self._lines, self._key = self._key, lines, key
            if previous is not None and previous != key:
                self.store.delete(previous)  # the shorter copy


def _newest_segments(keys: Iterable[str]) -> list[tuple[int, str]]:
    """Per segment number (ascending), the key of its copy with the most entries among ``keys``
    (the listing of ``history/checkpoints/``)."""
    best: dict[int, tuple[int, str]] = {}
    for key in keys:
        parsed = parse_segment_key(key)
        if parsed is not None and parsed[1] > best.get(parsed[0], (-1, ""))[0]:
            best[parsed[0]] = (parsed[1], key)
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
    for _, key in _newest_segments(o.key for o in store.list(HISTORY_PREFIX)):
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
