"""The follower: a read-only replica of a job's keyed state, kept up with its checkpoints.

:func:`follow` opens a :class:`Follower` on a job root. It restores the newest completed
checkpoint as a backend restores (on demand or at once, memory or disk working set), then
each :meth:`Follower.poll` (called by its background thread every ``poll_s`` seconds, or by
the caller) looks for a newer checkpoint and, when that checkpoint extends what the replica
applied (:meth:`~statelog.following.replica.OperatorReplica.gap`), reads and applies only the
changelog after it. When it does not (the job restored an earlier checkpoint, or what the
follower needs was materialized and collected), it restores that checkpoint again, logs why
and counts it (``position.restores``). With consistency ``"flushed"`` it also applies the
changelog the writer flushed after the checkpoint (:mod:`statelog.following.flushed`).

A follower never takes the writer lease and never writes to the root. Lookups
(:meth:`Follower.get`, :meth:`Follower.read`) see whole polls only: changes are read
before the lock that lookups take, and installed under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.catalog import JobCatalog
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.descriptors import StateDescriptor
from statelog.errors import ConfigError, CorruptionError, StatelogError, StateNotFoundError
from statelog.following.flushed import read_flushed
from statelog.following.newest import newer_checkpoint
from statelog.following.pin import DEFAULT_PIN_TTL_S, FollowerPin, check_pin_ttl
from statelog.following.position import Consistency, FollowPosition, Read, check_consistency
from statelog.following.replica import OperatorReplica, Prepared, ReplicaOptions
from statelog.materialization.manifest import Manifest
from statelog.options.engine import (
    DEFAULT_STATE_MEMORY,
    STATE_MEMORY,
    check_state_dir,
    check_state_store,
)
from statelog.state.backend import KeyedStateBackend
from statelog.state.timers import Timer
from statelog.store import open_store

T = TypeVar("T")

__all__ = ["Follower", "follow"]

log = logging.getLogger(__name__)

FOOTERS_KEPT = 1024  # segment footers the follower's reader keeps between polls
LINGER_BYTES = 64 << 20  # segment bytes a poll keeps for the other streams of the same segments

Operators = Iterable[str] | Mapping[str, Iterable[StateDescriptor]] | None


def _check_operators(operators: Operators) -> tuple[set[str] | None, dict[str, dict[str, StateDescriptor]]]:
    """``(the operator uids to follow or None for all, {uid: {state: descriptor}})``."""
    if operators is None:
        return None, {}
    if isinstance(operators, str):
        raise ConfigError(f"operators must be a list of operator uids or a mapping uid -> descriptors, got {operators!r}")
    if isinstance(operators, Mapping):
        descriptors = {str(uid): {d.name: d for d in ds} for uid, ds in operators.items()}
        return set(descriptors), descriptors
    uids = set(operators)
    bad = [u for u in uids if not isinstance(u, str) or not u]
    if bad:
        raise ConfigError(f"operator uids must be non-empty strings, got {bad[0]!r}")
    return uids, {}


class Follower:
    """A read-only replica of the keyed state of a job root (see :func:`follow`).

    Size: its reads, its polls and its lease pin share one lock and one position; what a poll
    does is in newest.py, flushed.py, replica.py and pin.py."""

    def __init__(
        self,
        root: str,
        *,
        operators: Operators = None,
        consistency: str | Consistency = "checkpoint",
        state_store: str = "memory",
        store_options: Mapping[str, Any] | None = None,
        poll_s: float | None = 1.0,
        state_memory: int | str = DEFAULT_STATE_MEMORY,
        state_dir: str | None = None,
        on_demand: bool = True,
        clock: Callable[[], int] | None = None,
        pin_ttl_s: float | None = DEFAULT_PIN_TTL_S,
    ) -> None:
        self.consistency = check_consistency(consistency)
        if poll_s is not None and (not isinstance(poll_s, int | float) or not poll_s > 0):
            raise ConfigError(f"poll_s must be a positive number of seconds or None (no thread), got {poll_s!r}")
        self._only, descriptors = _check_operators(operators)
        self._options = ReplicaOptions(
            check_state_store("state_store", state_store), STATE_MEMORY.check(state_memory),
            check_state_dir("state_dir", state_dir), bool(on_demand), clock, descriptors,
        )  # fmt: skip
        self._store = open_store(root, store_options)
        try:
            self._catalog = JobCatalog(self._store)
            info = self._catalog.open_job(None, create=False)
        except BaseException:
            self._store.close()
            raise
        self.root = self._store.url
        self._pin = FollowerPin(self._store, check_pin_ttl(pin_ttl_s))  # what GC keeps for it (pin.py)
        self._job_id, self._max_parallelism = info.job_id, info.max_parallelism
        self._replicas: dict[str, OperatorReplica] = {}
        self._manifests: dict[str, Manifest] = {}
        self._meta: CheckpointMetadata | None = None
        self._latest_id: int | None = None
        self._ahead = 0  # records applied beyond the checkpoint (consistency "flushed")
        self._flushed_ms: int | None = None
        self._acquired: dict[int, int] = {}  # writer lease generation -> its acquisition time (ms)
        # one reader for every poll: a segment's footer is read once, then only its new blocks
        self._reader = SegmentReader(self._store)
        self._reader.linger_bytes = LINGER_BYTES
        self._sizes: dict[str, int] = {}  # flushed segments found, by name: their sizes
        self.changes_applied = 0  # change records applied after the restores (not counting what they restored)
        self.restores = 0
        self.last_restore_reason: str | None = None
        self.last_error: BaseException | None = None
        self._lock = threading.RLock()  # lookups, and installing a poll's changes
        self._poll_lock = threading.Lock()  # one poll at a time
        self._moved = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.poll()
        except BaseException:
            self.close()
            raise
        if poll_s is not None:
            self._thread = threading.Thread(target=self._run, args=(float(poll_s),), name="statelog-follow", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:
        return f"Follower({self.root!r}, consistency={self.consistency.value!r}, checkpoint={self.checkpoint_id})"

    # -- position ------------------------------------------------------------------------------

    @property
    def checkpoint_id(self) -> int | None:
        """The checkpoint the state is built on (``None`` before the root has one)."""
        meta = self._meta
        return None if meta is None else meta.checkpoint_id

    @property
    def position(self) -> FollowPosition:
        """Where the follower is (:class:`~statelog.following.position.FollowPosition`)."""
        with self._lock:
            meta, ahead, flushed_ms = self._meta, self._ahead, self._flushed_ms
            latest = self._latest_id
        now = time.time()
        if meta is None:
            return FollowPosition(None, self.consistency, 0.0, 0.0, 0, 0, self.restores)
        lag = max(0.0, now - meta.timestamp_ms / 1000)
        newest_ms = max(meta.timestamp_ms, flushed_ms or 0) if ahead else meta.timestamp_ms
        return FollowPosition(
            meta.checkpoint_id, self.consistency, lag, max(0.0, now - newest_ms / 1000),
            max(0, (latest or meta.checkpoint_id) - meta.checkpoint_id), ahead, self.restores,
        )  # fmt: skip

    # -- lookups -------------------------------------------------------------------------------

    def _replica(self, operator: str) -> OperatorReplica:
        rep = self._replicas.get(operator)
        if rep is None:
            if self._meta is None:
                raise StatelogError(f"{self.root} has no completed checkpoint yet: the follower has no state to read")
            known = ", ".join(sorted(self._replicas)) or "none"
            raise StateNotFoundError(
                f"checkpoint {self._meta.checkpoint_id} of {self.root} holds no state of operator {operator!r} "
                f"that this follower follows (operators: {known})"
            )
        return rep

    def read(self, operator: str, state: str, key: Any, namespace: Any = None) -> Read:
        """The value of ``state`` of ``operator`` at ``key`` (and ``namespace``) with the
        checkpoint it was read at and the flushed records beyond it."""
        with self._lock:
            value = self._replica(operator).get(state, key, namespace)
            meta = self._meta
            return Read(value, None if meta is None else meta.checkpoint_id, self._ahead)

    def read_many(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> Read:
        """The values of ``state`` of ``operator`` at each of ``keys`` (and ``namespace``), all
        read from the same state: a :class:`Read` whose ``value`` is the list of values."""
        read = self.read_column(operator, state, keys, namespace)
        if not isinstance(read.value, list):  # an Arrow column
            read = Read(read.value.to_pylist(), read.checkpoint_id, read.flushed_records)
        return read

    def read_column(self, operator: str, state: str, keys: Iterable[Any], namespace: Any = None) -> Read:
        """:meth:`read_many` with the values as one Arrow array where the replica reads them a column
        at a time (:meth:`OperatorReplica.get_many`; what ``statelog serve`` sends over Flight)."""
        with self._lock:
            values = self._replica(operator).get_many(state, list(keys), namespace)
            return Read(values, None if self._meta is None else self._meta.checkpoint_id, self._ahead)

    def get(self, operator: str, state: str, key: Any, namespace: Any = None) -> Any:
        """The value of ``state`` of ``operator`` at ``key`` (and ``namespace``): a value
        state's value (its default when the follower knows the descriptor), a list, a map as a
        dict, a reducing state's value, an aggregating state's result (its accumulator when
        the descriptor was not given in ``operators``)."""
        with self._lock:  # (as read(), without building its Read)
            return self._replica(operator).get(state, key, namespace)

    def with_replicas(self, fn: Callable[[CheckpointMetadata | None, dict[str, OperatorReplica], int], T]) -> T:
        """``fn(checkpoint, replicas by operator, flushed records beyond it)`` with the lock
        held, so ``fn`` reads one state; it reads only and keeps no replica after returning."""
        with self._lock:
            return fn(self._meta, dict(self._replicas), self._ahead)

    def timers(self, operator: str, domain: str = "event") -> list[Timer]:
        """The pending timers of ``operator`` in ``domain`` (``"event"`` or ``"processing"``)."""
        with self._lock:
            return self._replica(operator).backend.timers.timers(domain)

    def backend(self, operator: str) -> KeyedStateBackend:
        """The replica of ``operator``: a keyed backend without changelog, to read only (its
        ``entries()``, ``get_state(...)``), from the thread that polls or with the follower
        not polling in the background (``poll_s=None``). A poll may replace it (a restore)."""
        with self._lock:
            return self._replica(operator).backend

    def operators(self) -> list[str]:
        """The operators followed at the current checkpoint."""
        with self._lock:
            return sorted(self._replicas)

    # -- polling -------------------------------------------------------------------------------

    def poll(self) -> FollowPosition:
        """Move to the newest completed checkpoint (and, consistency ``"flushed"``, the
        changelog flushed after it); returns the position."""
        with self._poll_lock:
            if self._stop.is_set():
                raise StatelogError("this follower is closed")
            self._poll_once()
        with self._moved:
            self._moved.notify_all()
        return self.position

    def _poll_once(self) -> None:  # one poll's work, under the poll lock
        at = None if self._meta is None else self._meta.checkpoint_id
        self._latest_id, latest = newer_checkpoint(
            self._catalog, at, job_id=self._job_id, max_parallelism=self._max_parallelism
        )  # fmt: skip
        if latest is not None:
            self._pin.pin(latest.checkpoint_id, *(() if at is None else (at,)))
            self._advance(latest)
            self._pin.pin(latest.checkpoint_id)
        self._pin.renew()
        try:
            if self.consistency is Consistency.FLUSHED and self._meta is not None:
                self._apply_flushed(self._meta)
        finally:
            self._reader.trim(FOOTERS_KEPT)

    def _followed(self, meta: CheckpointMetadata) -> list[str]:
        return sorted(uid for uid in meta.operators if self._only is None or uid in self._only)

    def _advance(self, meta: CheckpointMetadata) -> None:
        """Catch up with checkpoint ``meta``: its changelog after what each replica applied,
        or a new restore of the operators whose replica it does not extend."""
        old = self._meta
        same_writer = old is not None and meta.writer_generation is not None and (
            meta.writer_generation == old.writer_generation
        )
        reader = self._reader
        prepared: dict[str, Prepared] = {}
        fresh: dict[str, OperatorReplica] = {}
        reasons: list[str] = []
        try:
            for uid in self._followed(meta):
                rep = self._replicas.get(uid)
                why = "no replica yet" if rep is None else rep.gap(meta, same_writer)
                if why is None:
                    assert rep is not None
                    try:
                        prepared[uid] = rep.prepare(reader, meta)
                        continue
                    except CorruptionError as e:  # (collected: a segment it needs is gone)
                        reader.trim(0)
                        why = f"the changelog after what it applied is gone: {e}"
                if rep is not None:
                    reasons.append(f"operator {uid!r}: {why}")
                fresh[uid] = OperatorReplica(self._store, meta, uid, self._options, self._manifests)
        except BaseException:
            for rep in fresh.values():
                rep.close()
            raise
        with self._lock:
            for uid, p in prepared.items():
                self._replicas[uid].install(p)
                self.changes_applied += p.count
            gone = [rep for uid, rep in self._replicas.items() if uid in fresh or uid not in meta.operators]
            for rep in gone:
                del self._replicas[rep.uid]
            self._replicas.update(fresh)
            self._meta = meta
            self._ahead = sum(rep.ahead_of(meta) for rep in self._replicas.values())
            if not self._ahead:
                self._flushed_ms = None
        for rep in gone:
            rep.close()
        if old is None or reasons:
            self.restores += 1
        if reasons:
            self.last_restore_reason = "; ".join(reasons)
            log.warning(
                "follower of %s restored checkpoint %d again (restore %d) instead of catching up from checkpoint %d: %s",
                self.root, meta.checkpoint_id, self.restores, old.checkpoint_id if old else -1, self.last_restore_reason,
            )  # fmt: skip
        elif old is None:
            log.info("follower of %s restored checkpoint %d", self.root, meta.checkpoint_id)

    def _apply_flushed(self, meta: CheckpointMetadata) -> None:
        prepared, newest = read_flushed(self._reader, meta, self._replicas, self._acquired, self._sizes)
        if not prepared:
            return
        with self._lock:
            for uid, p in prepared.items():
                self._replicas[uid].install(p)
                self.changes_applied += p.count
            self._ahead = sum(rep.ahead_of(meta) for rep in self._replicas.values())
            if newest is not None:
                self._flushed_ms = newest

    def _run(self, poll_s: float) -> None:
        while not self._stop.wait(poll_s):
            try:
                self.poll()
                self.last_error = None
            except Exception as e:  # a store that fails now may answer at the next poll
                if self._stop.is_set():
                    return
                self.last_error = e
                log.warning("follower of %s: poll failed, trying again in %.3gs: %s", self.root, poll_s, e)

    def wait_for(self, checkpoint_id: int, timeout: float = 60.0) -> FollowPosition:
        """Wait until the follower's state is at checkpoint ``checkpoint_id`` or later (polling
        itself when it has no background thread); raises :class:`TimeoutError` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            cur = self.checkpoint_id
            if cur is not None and cur >= checkpoint_id:
                return self.position
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"follower of {self.root} is at checkpoint {cur}, not {checkpoint_id}, after {timeout}s"
                    + (f" (last poll error: {self.last_error})" if self.last_error else "")
                )
            if self._thread is None:
                self.poll()
                if (self.checkpoint_id or -1) < checkpoint_id:
                    time.sleep(min(0.05, left))
            else:
                with self._moved:
                    self._moved.wait(min(left, 1.0))

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop polling and drop the replicas (a disk working set's files are deleted)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._poll_lock, self._lock:
            for rep in self._replicas.values():
                rep.close()
            self._replicas.clear()
        self._pin.release()
        self._store.close()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def follow(root: str, **kwargs: Any) -> Follower:
    """A :class:`Follower` of the job at ``root``: a read-only replica of its keyed state at
    the newest completed checkpoint, kept up to date (docs/follow.md). Options:
    ``operators`` (uids, or uid -> descriptors to read with), ``consistency``
    (``"checkpoint"`` or ``"flushed"``), ``state_store`` (``"memory"`` or ``"disk"``, with
    ``state_memory`` and ``state_dir``), ``store_options``, ``poll_s`` (``None``: no
    background thread, call :meth:`Follower.poll`), ``on_demand``, ``clock`` (TTL, ms) and
    ``pin_ttl_s`` (the ttl of its lease, which pins the checkpoints it needs against GC;
    ``None``: no lease; docs/follow.md, "Followers and GC")."""
    return Follower(root, **kwargs)
