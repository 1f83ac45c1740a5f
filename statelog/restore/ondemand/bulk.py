"""The rest of an on-demand restore loaded at once, for a task thread that waits for the
whole state (:meth:`KeyedStateBackend.wait_loaded <statelog.state.backend.KeyedStateBackend.wait_loaded>`).

The background thread is stopped, and the rest is loaded as an eager restore loads it: the
remaining files fetched in order by a pool, each piece of whole key groups decoded by
another as soon as its files are in, ahead of the task thread, which builds the piece's keys
and entries at once; the tail replayed once at the end, with no hand-over between threads.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
import time
from collections.abc import Iterator

from statelog.restore.ondemand.options import OnDemandOptions
from statelog.restore.ondemand.parts import LoaderParts
from statelog.restore.ondemand.prepare import PreparedKeyGroup
from statelog.restore.ondemand.progress import KeyGroupState

__all__ = ["BulkLoader"]


class BulkLoader:
    """Loads every key group not handed out yet, in the task thread (:meth:`take_all`)."""

    def __init__(self, parts: LoaderParts, options: OnDemandOptions, raw_keys: bool) -> None:
        self._progress = parts.progress
        self._files, self._slices, self._tail, self._builder = parts.files, parts.slices, parts.tail, parts.builder
        self._options = options
        self._raw_keys = raw_keys

    def take_all(self) -> Iterator[PreparedKeyGroup]:
        """Every key group not handed out yet. The background thread claims no more key
        groups (what it prepared is taken first, the run it is preparing last), and the rest is
        loaded a run at a time: table files fetched and decoded by a pool (outside the GIL) in
        pieces of whole key groups of about ``unit_rows`` rows, ``decode_ahead`` pieces ahead of
        this thread, which builds the keys and entries of a piece at once (one part per piece
        and state, not one per key group); then the tail (the whole tail the background thread
        read, or this thread reads if there is none) is replayed once, after every base entry
        is in."""
        pr, files, opts = self._progress, self._files, self._options
        runs: list[list[int]] = []
        with pr.cond:  # the background thread claims nothing more; what it prepares is taken below
            pr.stop = True
            pr.cond.notify_all()
            pr.raise_error()
            partial = pr.in_state(KeyGroupState.PARTIAL)
            pr.mark(partial, KeyGroupState.PREPARING)
            for run in files.runs():
                claimed = [kg for kg in run if pr.state[kg] is KeyGroupState.UNLOADED]
                pr.mark(claimed, KeyGroupState.PREPARING)
                if claimed:
                    runs.extend(files.units(claimed))
        # the files' bytes are fetched by fetch_threads threads in order, in waves of at most
        # fetch_ahead_bytes; a piece's decoding starts once its files are in (the decoding
        # thread waits on a file's lock while it is being fetched)
        waves = files.waves(runs)
        ahead_n = opts.decode_ahead
        fetcher = cf.ThreadPoolExecutor(opts.fetch_threads, thread_name_prefix="statelog-ondemand-fetch")
        pool = cf.ThreadPoolExecutor(max(1, min(ahead_n, len(runs) + len(partial))),
                                     thread_name_prefix="statelog-ondemand-decode")  # fmt: skip
        try:
            files.fetch_wave(waves.popleft() if waves else [], fetcher)
            # the rest of key groups loaded by slices so far, decoded by the pool first
            rests = [pool.submit(self._slices.rest_rows, kg) for kg in partial]
            ahead = collections.deque(pool.submit(files.decode, run) for run in runs[:ahead_n])
            for kg, rows in zip(partial, rests, strict=True):
                p = self._slices.prepare_rest(kg, decoded=rows.result())
                pr.mark_taken([kg])
                yield p
            yield from pr.take_ready()
            thread = pr.thread
            assert thread is not None
            if self._raw_keys and runs:  # each key group is prepared with its tail: the tail first
                self._whole_tail(thread)
            tail_kgs: list[int] = []
            for i, run in enumerate(runs):
                if waves and waves[0][0][2] <= i:  # the next wave starts with this run's files
                    files.fetch_wave(waves.popleft(), fetcher)
                decoded = ahead.popleft().result()
                if i + ahead_n < len(runs):
                    ahead.append(pool.submit(files.decode, runs[i + ahead_n]))
                    # let the decoding thread take the GIL now, before this thread builds
                    # the piece's entries in long C calls: else it waits for the switch
                    # interval (5 ms) to start and may not be done when its piece is due
                    time.sleep(0)
                if self._raw_keys:  # a disk-backed working set: key group by key group, with its tail
                    prepared = self._builder.entries(run, decoded)
                else:  # in memory: the base of a piece now, the tail once every base is in
                    prepared = [self._builder.whole_run(run, decoded)]
                    tail_kgs.extend(run)
                del decoded
                pr.mark_taken(run)
                yield from prepared
            if tail_kgs:  # one replay of the tail, as an eager restore does
                self._whole_tail(thread)
                yield self._builder.tail_part(tail_kgs)
            # the run the background thread was preparing when it was stopped
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()
            yield from pr.take_ready()
        except BaseException as e:
            pr.fail(e)
            raise
        finally:
            fetcher.shutdown(wait=True, cancel_futures=True)
            pool.shutdown(wait=True, cancel_futures=True)

    def _whole_tail(self, thread: threading.Thread) -> None:
        """Wait for the whole tail while the background thread reads it (in memory, the bases
        are installed meanwhile: the tail is replayed after them), or read it here."""
        pr = self._progress
        with pr.cond:
            while self._tail.whole is None and pr.error is None and thread.is_alive():
                pr.cond.wait(0.05)
            pr.raise_error()
        with self._tail.lock:
            need_tail = self._tail.whole is None
        if need_tail:  # no background thread (stopped before it read the tail): read it here
            self._tail.read_whole()
