"""Where each key group of an on-demand restore is, shared by the task thread and the
background thread under one condition (:class:`Progress`)."""

from __future__ import annotations

import enum
import threading

from statelog.keys.groups import KeyGroupRange
from statelog.restore.ondemand.prepare import PreparedKeyGroup

__all__ = ["KeyGroupState", "Progress"]


class KeyGroupState(enum.Enum):
    """A key group's state in the loader."""

    UNLOADED = "unloaded"  # nobody prepared any of it yet
    PREPARING = "preparing"  # a thread prepares it (or what is left of it)
    READY = "ready"  # prepared by the background thread, not taken by the task thread yet
    TAKEN = "taken"  # handed to the task thread, all of it
    PARTIAL = "partial"  # some of its slices were handed out, the rest not


class Progress:
    """The key groups' states, what the background thread prepared, and the flags both
    threads wait on (``cond``)."""

    def __init__(self, key_groups: KeyGroupRange) -> None:
        self.cond = threading.Condition()
        self.state = dict.fromkeys(key_groups, KeyGroupState.UNLOADED)
        self.ready: dict[int, PreparedKeyGroup] = {}  # READY key groups
        self.taken = 0  # TAKEN key groups
        self.stop = False  # the background thread claims nothing more
        # preparations under way in the task thread (a record waits for them): the background
        # thread pauses for them at its next safe point, so they do not share the GIL with it
        self.urgent = 0
        self.error: BaseException | None = None  # raised in the task thread, never swallowed
        self.thread: threading.Thread | None = None  # the background thread (BackgroundLoader)

    @property
    def done(self) -> bool:
        """Every key group was handed to the task thread."""
        return self.taken == len(self.state)

    def in_state(self, st: KeyGroupState) -> list[int]:
        """The key groups in state ``st`` (call it with ``cond`` held)."""
        return [kg for kg, s in self.state.items() if s is st]

    def mark(self, kgs: list[int], st: KeyGroupState) -> None:
        """Put ``kgs`` in state ``st`` (call it with ``cond`` held)."""
        for kg in kgs:
            self.state[kg] = st

    def mark_taken(self, kgs: list[int]) -> None:
        with self.cond:
            self.mark(kgs, KeyGroupState.TAKEN)
            self.taken += len(kgs)

    def take_ready(self) -> list[PreparedKeyGroup]:
        """Every key group the background thread prepared since the last call."""
        with self.cond:
            self.raise_error()
            if not self.ready:
                return []
            out = list(self.ready.values())
            self.ready.clear()
            for p in out:
                self.state[p.key_group] = KeyGroupState.TAKEN
            self.taken += len(out)
            self.cond.notify_all()  # room for the read-ahead
            return out

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def fail(self, e: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = e
            self.cond.notify_all()

    def pause_for_task(self) -> None:
        """(A safe point of the background thread, which holds no lock there.) Wait while the
        task thread prepares a key group a record needs: both threads' Python work would share
        the GIL, and the record would wait twice as long (measured at 10^7 keys: the first
        record after 0.14-0.21 s with the background thread reading the whole tail meanwhile,
        0.05-0.10 s without it)."""
        if self.urgent and threading.current_thread() is self.thread:
            with self.cond:
                while self.urgent and not self.stop and self.error is None:
                    self.cond.wait(0.05)
