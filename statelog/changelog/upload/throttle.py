"""Back-pressure of a changelog writer: segment bytes in flight against a cap, and which
streams' tasks must wait.

A task thread appends without locks; to slow it down its stream is *throttled*
(:meth:`~statelog.changelog.stream.ChangelogStream.set_throttled`): the next append or full
buffer blocks in the writer's ``wait_writable`` until the throttle lifts it. A stream is
throttled while its own buffer holds ``max_buffered_records`` or more, every stream while
the uploads in flight hold ``max_inflight_bytes`` or more, and every stream for good once
the writer failed (its tasks then raise the failure).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from statelog.changelog.stream import ChangelogStream


class UploadThrottle:
    """The back-pressure state of one writer, guarded by the writer's condition ``cond``.

    ``streams`` is the writer's live map of open streams. Every change that may lift
    back-pressure notifies ``cond``, which the waiting tasks and the flusher wait on.
    """

    def __init__(
        self,
        cond: threading.Condition,
        streams: Mapping[str, ChangelogStream],
        max_inflight_bytes: int,
        max_buffered_records: int,
    ) -> None:
        self.cond = cond
        self._streams = streams
        self.max_inflight_bytes = max_inflight_bytes
        self.max_buffered_records = max_buffered_records
        self.inflight_bytes = 0  # bytes of segments submitted and not uploaded yet
        self.failed = False  # the writer failed: every stream stays throttled

    def update_locked(self) -> None:
        """Throttle streams with too many buffered records, or all while uploads are over the cap
        (call holding ``cond``)."""
        over = self.inflight_bytes >= self.max_inflight_bytes or self.failed
        changed = False
        for s in self._streams.values():
            should = over or s.buffered >= self.max_buffered_records
            if should != s.throttled:
                s.set_throttled(should)
                changed = True
        if changed:
            self.cond.notify_all()

    def update(self) -> None:
        with self.cond:
            self.update_locked()

    def fail_locked(self) -> None:
        """The writer failed: throttle every stream for good (call holding ``cond``)."""
        self.failed = True
        for s in self._streams.values():
            s.set_throttled(True)

    def wait_for_capacity(self) -> None:
        """Block (the flusher) while the uploads in flight hold the cap, or until the writer failed."""
        with self.cond:
            while self.inflight_bytes >= self.max_inflight_bytes and not self.failed:
                self.update_locked()
                self.cond.wait(0.05)

    def seize(self, size: int) -> None:
        """A segment of ``size`` bytes goes to the uploader."""
        with self.cond:
            self.inflight_bytes += size
            self.update_locked()

    def release(self, size: int) -> None:
        """A segment of ``size`` bytes finished uploading (or failed)."""
        with self.cond:
            self.inflight_bytes -= size
            self.update_locked()
            self.cond.notify_all()
