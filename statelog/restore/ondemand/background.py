"""The background thread of an on-demand restore.

It reads the whole tail first, then prepares the key groups in key-group order, a run of
key groups held by the same table files at a time (one decoding per file and run instead of
one per key group), at most ``read_ahead`` key groups ahead of what the task thread has
installed (the memory a restore needs beyond the loaded state is bounded by that and by the
table files being decoded). It only prepares: the task thread installs what it prepared.
While the task thread prepares a key group a record needs, it pauses at its next safe point
(:meth:`Progress.pause_for_task`).
"""

from __future__ import annotations

import threading

from statelog.restore.ondemand.parts import LoaderParts
from statelog.restore.ondemand.prepare import PreparedKeyGroup
from statelog.restore.ondemand.progress import KeyGroupState

__all__ = ["BackgroundLoader"]


class BackgroundLoader:
    """Prepares the key groups nobody took yet, in order, in a daemon thread (``progress.thread``)."""

    def __init__(self, parts: LoaderParts, read_ahead: int) -> None:
        self._progress = progress = parts.progress
        self._files, self._slices, self._tail, self._builder = parts.files, parts.slices, parts.tail, parts.builder
        self._read_ahead = read_ahead
        progress.thread = threading.Thread(target=self._run, name="statelog-ondemand-restore", daemon=True)

    def start(self) -> None:
        assert self._progress.thread is not None
        self._progress.thread.start()

    def _run(self) -> None:
        pr = self._progress
        try:
            self._tail.read_whole()
        except BaseException as e:  # noqa: BLE001 - handed to the task thread, raised there
            pr.fail(e)
            return
        with pr.cond:
            pr.cond.notify_all()  # a task thread in take_all waits for the tail
        for run in self._files.runs():
            if not self._step(run):
                return
        # key groups the task thread was loading by slices when their run came
        while True:
            with pr.cond:
                while not pr.stop and pr.error is None:
                    partial = pr.in_state(KeyGroupState.PARTIAL)
                    if partial or KeyGroupState.PREPARING not in pr.state.values():
                        break
                    pr.cond.wait(0.05)
                else:
                    return
            if not partial or not self._step(partial):
                return

    def _step(self, kgs: list[int]) -> bool:
        """Prepare what is left of ``kgs`` (a run of key groups held by the same table files, or
        key groups loaded by slices so far); False when the thread is to stop."""
        pr = self._progress
        pr.pause_for_task()
        with pr.cond:
            while not pr.stop and pr.error is None and len(pr.ready) >= self._read_ahead:
                pr.cond.wait()
            if pr.stop or pr.error is not None:
                return False
            claimed = [kg for kg in kgs if pr.state[kg] is KeyGroupState.UNLOADED]
            partial = [kg for kg in kgs if pr.state[kg] is KeyGroupState.PARTIAL]
            pr.mark(claimed + partial, KeyGroupState.PREPARING)
        try:
            prepared = self._prepare_many(claimed) if claimed else []
            for kg in partial:
                pr.pause_for_task()
                prepared.append(self._slices.prepare_rest(kg))
        except BaseException as e:  # noqa: BLE001 - handed to the task thread, raised there
            pr.fail(e)
            return False
        with pr.cond:
            for p in prepared:
                pr.ready[p.key_group] = p
                pr.state[p.key_group] = KeyGroupState.READY
            pr.cond.notify_all()
        return True

    def _prepare_many(self, kgs: list[int]) -> list[PreparedKeyGroup]:
        """Prepare key groups held by the same table files (one key group, or a run's)."""
        decoded = self._files.decode(kgs)
        self._progress.pause_for_task()
        return self._builder.entries(kgs, decoded)
