"""The job master: deploys the job on worker processes, runs the checkpoint coordinator,
detects failures and restarts the job from its latest completed checkpoint.

One attempt of a job:

1. sinks recover (commit the pending transactions of checkpoints ``<=`` the one restored,
   abort the rest);
2. the launcher (:mod:`runtime.launcher`) starts ``parallelism`` workers: local processes
   (``multiprocessing``, ``forkserver`` by default with the runtime preloaded, or ``spawn``)
   or the tasks of a Spark barrier stage (:mod:`runtime.spark_cluster`); each opens a
   listening socket and reports it. Every connection proves knowledge of the run's job
   secret first (:mod:`runtime.auth`);
3. every worker gets the pickled job graph, the addresses of its peers, its source splits
   with their positions (from the restored checkpoint) and the checkpoint to restore; it
   builds its tasks, restores their backends and reports running;
4. the coordinator checkpoints periodically; when every source has finished, a final
   checkpoint commits the last output and the workers are stopped.

A worker that exits (e.g. SIGKILL: its process sentinel fires, its pipe reaches EOF) or
reports an exception, or too many failed checkpoints, fail the attempt: all workers are
killed and, if the restart strategy allows, the job restarts from the latest checkpoint
completed in this run (or the one it was started from).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from typing import Any

import cloudpickle

from materializer import BackgroundMaterializer, start_background
from materializer.savepoint import create_savepoint
from runtime.auth import new_secret
from runtime.config import CHANGELOG, JobConfig
from runtime.coordinator import CheckpointCoordinator
from runtime.errors import (
    JobCancelledError,
    JobFailedError,
    NonRestoredStateError,
    RuntimeJobError,
    TaskFailedError,
    WorkerLostError,
)
from runtime.graph import JobGraph, StreamGraph
from runtime.inflight import INFLIGHT_KEY, collect_inflight
from runtime.launcher import Launcher, LocalLauncher, WorkerProc
from runtime.metrics import JobMetrics
from runtime.restart import RestartStrategy
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import FencedError, RestoreRequiredError, StatelogError
from statelog.job import StateJob
from statelog.layout import check_savepoint_name
from statelog.metrics import MetricsServer
from statelog.store import reopen_store

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
# a worker's channel error names a dead peer as the cause if one is seen dead within this long
PEER_DEATH_GRACE_S = 1.0


@dataclass
class _SavepointRequest:
    name: str
    stop: bool
    future: Future[CheckpointMetadata]
    min_id: int | None = None  # the first checkpoint id the savepoint may be taken of
    started: bool = False
    checkpoint_id: int | None = None


@dataclass
class JobResult:
    job_name: str
    run_id: str
    attempts: int
    completed_checkpoints: list[int]
    failed_checkpoints: int
    final_checkpoint: int | None
    restored_from: int | str | None
    collected: dict[str, list[Any]]
    checkpoint_stats: dict[int, dict[str, Any]]
    failures: list[str]
    duration_s: float
    savepoint: str | None = None  # set when the job stopped with a savepoint
    # per attempt that restored state: the slowest worker's time from deployment to its first
    # record and to every key group loaded (equal for eager restores: both follow the restore)
    restore_stats: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def restarts(self) -> int:
        return self.attempts - 1


def serialize_graph(graph: JobGraph) -> bytes:
    """Pickle the job graph; lambdas and closures go through cloudpickle."""
    try:
        return pickle.dumps(graph, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(graph, protocol=5)


class JobMaster:
    def __init__(
        self,
        name: str,
        graph: StreamGraph,
        config: JobConfig,
        restart_strategy: RestartStrategy,
        *,
        restore: int | str | None = None,
        allow_non_restored_state: bool = False,
        launcher: Launcher | None = None,
    ) -> None:
        self.name = name
        self.launcher = launcher or LocalLauncher()
        self._secret = new_secret()  # proven on every connection of this run; never logged
        self.config = config
        self.restart_strategy = restart_strategy
        self.restore = restore
        self.allow_non_restored_state = allow_non_restored_state
        self.job_graph = JobGraph.build(graph)
        self.graph_bytes = serialize_graph(self.job_graph)
        self.run_id = uuid.uuid4().hex
        self.lock = threading.Lock()
        self.attempt = 0
        self.restore_stats: dict[int, dict[str, Any]] = {}
        self.metrics = JobMetrics(self)  # served at metrics_port while the job runs
        self.metrics_server: MetricsServer | None = None
        self.vertex_names = {str(v.id): v.name for v in self.job_graph.vertices}
        self.running_attempt = 0
        self.running_changed = threading.Condition(self.lock)
        self.workers: list[WorkerProc] = []
        self.completed: list[int] = []
        self.stats: dict[int, dict[str, Any]] = {}
        self.failures: list[str] = []
        self.failed_checkpoints = 0
        self.collected: dict[str, list[Any]] = {}
        self._uncommitted: list[tuple[int, str, list[Any]]] = []
        self._cancel = threading.Event()
        self._fenced_event = threading.Event()  # set when this process lost the root
        self._granted = 0.0  # the workers' write grant: the lease deadline last sent (wall clock)
        self._savepoints: list[_SavepointRequest] = []
        self._stopped_with: _SavepointRequest | None = None
        self._materializer: BackgroundMaterializer | None = None  # with config.materializer
        p = config.parallelism
        self.task_keys = {f"{v.id}.{i}" for v in self.job_graph.vertices for i in range(p)}
        self.source_task_keys = {
            f"{v.id}.{i}" for v in self.job_graph.vertices if v.source is not None for i in range(p)
        }

    # -- client side ---------------------------------------------------------------------------

    def worker_pids(self) -> list[int]:
        with self.lock:
            return [w.pid for w in self.workers if w.pid is not None]

    def cancel(self) -> None:
        self._cancel.set()

    def request_savepoint(self, name: str, stop: bool) -> Future[CheckpointMetadata]:
        if self.config.state_backend != CHANGELOG:
            raise RuntimeJobError(
                f"state_backend={self.config.state_backend!r} is a benchmark baseline: it takes no savepoints"
            )
        req = _SavepointRequest(check_savepoint_name(name), stop, Future())
        with self.lock:
            self._savepoints.append(req)
        return req.future

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> JobResult:
        t0 = time.monotonic()
        cfg = self.config
        self.job = StateJob(
            cfg.state_root,
            max_parallelism=cfg.max_parallelism,
            store_options=cfg.store_options,
            retain_checkpoints=cfg.retain_checkpoints,
            writer_owner=f"runtime job {self.name!r}",
            writer_lease_ttl_s=cfg.writer_lease_ttl_s,
        )
        try:
            if cfg.metrics_port is not None:
                self.metrics_server = MetricsServer(self.metrics.registry, self.health, cfg.metrics_host,
                                                    cfg.metrics_port)  # fmt: skip
            # the master publishes the checkpoints: it holds the root's writer lease (a second
            # job on this root is refused here); its workers write changelog under it
            self.job.acquire_writer_lease()
            self.job.on_fenced(self._on_fenced)
            if cfg.materializer is not None:
                settings = cfg.materializer
                if settings.retain_checkpoints is None:  # GC keeps what the job retains
                    settings = replace(settings, retain_checkpoints=cfg.retain_checkpoints)
                self._materializer = start_background(self.job, settings)  # stopped before job.close()
            if self.restore is None:
                self._check_fresh_start()
            meta = self.job.resolve_checkpoint(self.restore)
            if self.restore not in (None, "none") and meta is None:
                log.info("restore=%r: no checkpoint yet, starting empty", self.restore)
            if meta is not None:
                self._check_restore(meta)
            restore_ref: int | str | None = self._ref(meta)
            self.next_id = self.job.next_checkpoint_id()
            if meta is not None:
                self.next_id = max(self.next_id, meta.checkpoint_id + 1)
            self.first_id = self.next_id  # checkpoints of this run have ids >= first_id
            final = None
            while True:
                self.attempt += 1
                try:
                    final = self._run_attempt(restore_ref, meta)
                    break
                except JobCancelledError:
                    self._teardown(kill=True)
                    raise
                except Exception as exc:  # noqa: BLE001 - every failure goes through the restart strategy
                    t_fail = time.monotonic()
                    self._teardown(kill=True)
                    reason = f"{type(exc).__name__}: {exc}"
                    self.failures.append(reason)
                    lost = self._root_lost(exc)
                    if lost is not None:  # final: no restart, no restore, no sink recovery
                        raise lost from (None if lost is exc else exc)
                    delay = self.restart_strategy.next_delay()
                    if delay is None:
                        raise JobFailedError(
                            f"job {self.name!r} failed in attempt {self.attempt} and "
                            f"{self.restart_strategy.describe()} allows no further restart: {reason}"
                        ) from exc
                    log.warning(
                        "attempt %d failed (%s); restarting in %.2fs (teardown took %.2fs)",
                        self.attempt, reason, delay, time.monotonic() - t_fail,
                    )
                    if self._cancel.wait(delay):
                        raise JobCancelledError(f"job {self.name!r} was cancelled") from exc
                    latest = self._latest_completed()
                    if latest is not None:
                        meta = self.job.load_checkpoint(latest)
                        restore_ref = meta.checkpoint_id
            self._teardown(kill=False)
            self.job.check_root()  # a sink's commit acts on the root's checkpoints
            for node in self.job_graph.stream.sinks():
                assert node.sink is not None
                node.sink.recover(final)  # commit what a lost notification left pending
            return JobResult(
                job_name=self.name,
                run_id=self.run_id,
                attempts=self.attempt,
                completed_checkpoints=list(self.completed),
                failed_checkpoints=self.failed_checkpoints,
                final_checkpoint=final,
                restored_from=self.restore,
                collected=self.collected,
                checkpoint_stats=self.stats,
                failures=self.failures,
                duration_s=time.monotonic() - t0,
                savepoint=self._stopped_with.name if self._stopped_with is not None else None,
                restore_stats=self.restore_stats,
            )
        finally:
            with self.lock:
                left, self._savepoints = self._savepoints, []
            for req in left:
                if not req.started and not req.future.done():  # a started one finishes by itself
                    req.future.set_exception(RuntimeJobError(f"job {self.name!r} ended before savepoint {req.name!r}"))
            if self._materializer is not None:
                self._materializer.stop()
                self._materializer = None
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None
            self.job.close(flush=False)

    def _on_fenced(self, error: FencedError) -> None:
        """The writer lease was lost (any thread): the main loop ends the job at its next poll."""
        self._fenced_event.set()

    def _root_lost(self, exc: BaseException) -> FencedError | None:
        """The error that ends this process for good if ``exc`` (or anything else) shows that
        it lost the root, else ``None``. A failure right after a stall (a sink fenced by the
        new owner's producers, say) is checked against the lease before any restart."""
        if isinstance(exc, FencedError):
            return exc
        try:
            self.job.check_root()
        except FencedError as lost:
            return lost
        except StatelogError as e:  # the store cannot tell: the next attempt checks again first
            log.warning("could not check the writer lease of %s: %s", self.job.root, e)
        return None

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: healthy while an attempt runs; restarting or not started is not."""
        details = {"job": self.name, "attempt": self.attempt, "completed_checkpoints": len(self.completed),
                   "restarts": max(0, self.attempt - 1)}  # fmt: skip
        if self.running_attempt and self.running_attempt == self.attempt:
            return True, details
        reason = f"restarting after: {self.failures[-1]}" if self.failures else "not running yet"
        return False, {**details, "reason": reason}

    def _latest_completed(self) -> int | None:
        """The newest checkpoint of this run: the catalog is the truth (a checkpoint exists
        once its metadata does), whatever happened between its publish and its notification."""
        ids = [i for i in self.job.catalog.checkpoint_ids() if i >= self.first_id]
        with self.lock:
            ids += self.completed
        return max(ids) if ids else None

    def _ref(self, meta: CheckpointMetadata | None) -> int | str | None:
        """How workers name the checkpoint to restore: its id, or ``"savepoint:NAME"``."""
        if meta is None:
            return None
        return self.restore if meta.kind == "savepoint" else meta.checkpoint_id

    def _check_fresh_start(self) -> None:
        """A run without ``restore=`` on a root with checkpoints would start from empty state
        and repeat the sinks' output: refuse it, naming the newest checkpoint and the choices."""
        latest = self.job.catalog.latest()
        if latest is not None:
            raise RestoreRequiredError(
                f"the state root {self.job.root} already has checkpoints (the newest: checkpoint "
                f"{latest.checkpoint_id}, operators {sorted(latest.operators)}); job {self.name!r} "
                f"started without restore= would start from empty state and write its output again. "
                f"Pass restore='latest' (or restore={latest.checkpoint_id}, or 'savepoint:NAME') to "
                f"continue from it, or restore='none' to start fresh on purpose"
            )

    def _check_restore(self, meta: CheckpointMetadata) -> None:
        stream = self.job_graph.stream
        ops = sorted(set(meta.operators) - stream.stateful_uids())
        srcs = sorted(set(meta.sources) - stream.source_uids() - {INFLIGHT_KEY})
        if (ops or srcs) and not self.allow_non_restored_state:
            what = []
            if ops:
                what.append(f"state of operator uid(s) {ops}")
            if srcs:
                what.append(f"positions of source uid(s) {srcs}")
            raise NonRestoredStateError(
                f"{meta.kind} {meta.checkpoint_id} holds {' and '.join(what)} that this job does not have "
                f"(its stateful uids: {sorted(stream.stateful_uids())}, sources: {sorted(stream.source_uids())}); "
                "keep the uids, or pass allow_non_restored_state=True to drop that state"
            )
        if ops or srcs:
            log.warning("dropping non-restored state of %s", ops + srcs)

    def _assignments(self, meta: CheckpointMetadata | None) -> list[dict[int, dict[str, Any]]]:
        p = self.config.parallelism
        out: list[dict[int, dict[str, Any]]] = [{} for _ in range(p)]
        for node in self.job_graph.stream.nodes:
            if node.source is None:
                continue
            restored: dict[str, Any] = dict(meta.sources.get(node.uid or "", {})) if meta is not None else {}
            splits = sorted(set(node.source.splits()) | set(restored))
            for k, split in enumerate(splits):
                out[k % p].setdefault(node.id, {})[split] = restored.get(split)
        return out

    # -- one attempt ---------------------------------------------------------------------------

    def _run_attempt(self, restore_ref: int | str | None, meta: CheckpointMetadata | None) -> int:
        cfg = self.config
        committed_upto = meta.checkpoint_id if meta is not None else None
        self.job.check_root()  # only the root's owner recovers sinks and starts workers
        for node in self.job_graph.stream.sinks():
            assert node.sink is not None
            node.sink.recover(committed_upto)
        self._uncommitted.clear()
        self._finished: set[str] = set()
        level = cfg.worker_log_level
        if level is None:
            level = logging.getLogger("runtime").getEffectiveLevel()
        t_start = time.monotonic()
        workers = self.launcher.start(cfg, self._secret, level, self.attempt)
        with self.lock:
            self.workers = workers
        log.info("attempt %d: started %d workers (restore %r)", self.attempt, len(workers), restore_ref)
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(w.address is None for w in workers):
            self._poll(min(1.0, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise WorkerLostError(f"workers did not start within {START_TIMEOUT_S}s")
        t_ready = time.monotonic()
        peers = [w.address for w in workers]
        assignments = self._assignments(meta)
        for w in workers:
            spec = {
                "config": cfg,
                "run_id": self.run_id,
                "attempt": self.attempt,
                "graph": self.graph_bytes,
                "restore": restore_ref,
                "peers": peers,
                "assignments": assignments[w.index],
                "lease_valid_until": self._granted,
            }
            w.conn.send(("deploy", spec))
        while not all(w.running for w in workers):
            self._poll(min(1.0, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise WorkerLostError(f"workers did not deploy within {START_TIMEOUT_S}s")
        self.coordinator = CheckpointCoordinator(
            self.job,
            set(self.task_keys),
            interval_s=cfg.checkpoint_interval_s,
            timeout_s=cfg.checkpoint_timeout_s,
            tolerable_failures=cfg.tolerable_failed_checkpoints,
            first_id=self.next_id,
            broadcast=self._broadcast,
            on_complete=self._on_complete,
            attempt=self.attempt,
            state_backend=cfg.state_backend,
            mode=cfg.mode.value,
            previous=meta,
            max_inflight_bytes=cfg.max_inflight_bytes,
        )
        if self._finished >= self.source_task_keys:
            self.coordinator.request_final()
        with self.lock:
            if any(r.stop and r.started for r in self._savepoints):
                self.coordinator.suspended = True  # stopping with a savepoint already taken
        with self.lock:
            self.running_attempt = self.attempt
            self.running_changed.notify_all()
        log.info(
            "attempt %d running: workers up in %.2fs, deployed and restored in %.2fs",
            self.attempt, t_ready - t_start, time.monotonic() - t_ready,
        )
        try:
            while self.coordinator.final_completed is None:
                if self._cancel.is_set():
                    raise JobCancelledError(f"job {self.name!r} was cancelled")
                if self._service_savepoints():
                    assert self._stopped_with is not None and self._stopped_with.checkpoint_id is not None
                    return self._stopped_with.checkpoint_id
                now = time.monotonic()
                self.coordinator.tick(now)
                self._poll(min(0.2, self.coordinator.next_wakeup(time.monotonic())))
        finally:
            self.next_id = self.coordinator.next_id
            self.failed_checkpoints += self.coordinator.failed_total
            self.coordinator.failed_total = 0
        return self.coordinator.final_completed

    def _service_savepoints(self) -> bool:
        """Ask for checkpoints for new savepoint requests; True when the job stops with one."""
        with self.lock:
            reqs = list(self._savepoints)
        for req in reqs:
            if req.min_id is None:
                req.min_id = self.coordinator.next_id
                self.coordinator.trigger_soon()
            if req.future.done():
                with self.lock:
                    self._savepoints.remove(req)
                if req.stop:
                    if req.future.exception() is None:
                        self._stopped_with = req
                        return True
                    self.coordinator.suspended = False  # the savepoint failed: keep running
        return False

    def _start_savepoint(self, req: _SavepointRequest, cid: int) -> None:
        req.started, req.checkpoint_id = True, cid
        if req.stop:
            self.coordinator.suspended = True  # nothing may commit after the savepoint's checkpoint

        def run() -> None:
            try:
                # a handle fenced like the job's: a process that lost the root writes no savepoint
                own = reopen_store(self.job.store)
                try:
                    req.future.set_result(create_savepoint(own or self.job.store, cid, req.name))
                finally:
                    if own is not None:
                        own.close()
            except BaseException as e:  # noqa: BLE001 - reported through the future
                req.future.set_exception(e)

        threading.Thread(target=run, name=f"savepoint-{req.name}", daemon=True).start()

    def _broadcast(self, msg: tuple[Any, ...]) -> None:
        for w in self.workers:
            try:
                w.conn.send(msg)
            except OSError as e:
                raise WorkerLostError(f"worker {w.index} (pid {w.pid}) is unreachable: {e}") from None

    def _poll(self, timeout: float) -> None:
        if self._fenced_event.is_set() and self.job.fenced is not None:
            raise self.job.fenced
        self._grant_writes()
        by_obj: dict[Any, tuple[str, WorkerProc | None]] = {}
        for w in self.workers:
            by_obj[w.conn] = ("conn", w)
            if w.sentinel is not None:
                by_obj[w.sentinel] = ("exit", w)
        for obj in self.launcher.waitables():
            by_obj[obj] = ("launcher", None)
        ready = wait(list(by_obj), max(0.0, timeout))
        # messages first: a failing worker's report comes before its exit
        for obj in sorted(ready, key=lambda o: by_obj[o][0] != "conn"):
            kind, w = by_obj[obj]
            if w is None:
                for other in self.workers:  # a worker's own report or death names the cause best
                    self._drain(other)
                raise WorkerLostError(f"the workers' cluster side failed: {self.launcher.failure()}")
            if kind == "conn":
                self._drain(w)
            else:
                self._drain(w)
                if not w.stopped:
                    w.proc.join(0.1)
                    raise WorkerLostError(
                        f"worker {w.index} (pid {w.pid}) exited with code {w.proc.exitcode}"
                    )

    def _grant_writes(self) -> None:
        """Send the workers the lease's new deadline when it moved (runtime/lease_grant.py)."""
        valid_until = self.job.writer_lease_valid_until()
        if valid_until is None or valid_until <= self._granted + 0.05:
            return
        self._granted = valid_until
        for w in self.workers:
            if w.running:  # deployed: the deploy message carried the grant until then
                with contextlib.suppress(OSError):  # a dead worker is noticed by the poll
                    w.conn.send(("lease", valid_until))

    def _drain(self, w: WorkerProc) -> None:
        try:
            while w.conn.poll():
                self._on_message(w, w.conn.recv())
        except (EOFError, OSError):
            if not w.stopped:
                raise WorkerLostError(f"worker {w.index} (pid {w.pid}) closed its connection") from None

    def _on_message(self, w: WorkerProc, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ack":
            _, cid, task, handles, sources, stats = msg
            self.metrics.observe_task(task, stats)
            self.coordinator.ack(cid, task, handles, sources, stats)
        elif kind == "committables":
            _, cid, _task, by_uid = msg
            for uid, records in by_uid.items():
                self._uncommitted.append((cid, uid, records))
        elif kind == "decline":
            _, cid, task, reason = msg
            self.coordinator.decline(cid, task, reason)
        elif kind == "source_finished":
            self._finished.add(msg[1])
            if self._finished >= self.source_task_keys and self.running_attempt == self.attempt:
                self.coordinator.request_final()
        elif kind == "ready":
            _, _i, address, pid = msg
            with self.lock:
                w.address, w.pid = tuple(address), pid
        elif kind == "running":
            w.running = True
        elif kind == "failed":
            if str(msg[2]).startswith("ChannelError"):  # usually secondary: name the dead worker
                dead = self._dead_peer(w)
                if dead is not None:
                    raise WorkerLostError(f"worker {dead.index} (pid {dead.pid}) exited with code {dead.proc.exitcode}")
            raise TaskFailedError(f"worker {w.index} (pid {w.pid}) failed:\n{msg[2]}")
        elif kind == "restored":
            stats = self.restore_stats.setdefault(self.attempt, {"workers": 0, "on_demand": self.config.on_demand_restore})
            stats["workers"] += 1
            for k, v in msg[2].items():
                stats[k] = max(stats.get(k, 0.0), v)
        elif kind == "stopped":
            w.stopped = True
        else:
            log.warning("unknown message from worker %d: %r", w.index, kind)

    def _dead_peer(self, w: WorkerProc) -> WorkerProc | None:
        """A worker other than ``w`` seen dead within ``PEER_DEATH_GRACE_S`` (a forkserver
        child's exit reaches its Popen only after the forkserver reaped it), or None."""
        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        while True:
            dead = next((o for o in self.workers if o is not w and not o.proc.is_alive()), None)
            if dead is not None or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def _on_complete(self, meta: CheckpointMetadata) -> None:
        cid = meta.checkpoint_id
        with self.lock:
            self.completed.append(cid)
            reqs = [r for r in self._savepoints if not r.started and r.min_id is not None and cid >= r.min_id]
        self.stats[cid] = dict(meta.stats)
        self.metrics.observe_checkpoint(cid, meta.stats, meta.changelog_bytes)
        for req in reqs:
            self._start_savepoint(req, cid)
        keep = []
        for entry in self._uncommitted:
            if entry[0] <= cid:
                self.collected.setdefault(entry[1], []).extend(entry[2])
            else:
                keep.append(entry)
        self._uncommitted = keep
        try:  # in-flight data (unaligned checkpoints) of checkpoints no longer retained
            collect_inflight(self.job.store, self.job.catalog.checkpoint_ids(), cid)
        except Exception as e:  # noqa: BLE001 - garbage only; the next checkpoint tries again
            log.warning("could not delete old in-flight data: %s", e)

    def _teardown(self, kill: bool) -> None:
        workers = self.workers
        if not kill:
            for w in workers:
                with contextlib.suppress(OSError):
                    w.conn.send(("stop",))
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while any(not w.stopped and w.proc.is_alive() for w in workers) and time.monotonic() < deadline:
                for w in workers:
                    try:
                        while not w.stopped and w.conn.poll(0.01):
                            msg = w.conn.recv()
                            if msg[0] == "stopped":
                                w.stopped = True
                    except (EOFError, OSError):
                        w.stopped = True
        for w in workers:
            if w.proc.is_alive() and (kill or not w.stopped):
                w.proc.kill()
        for w in workers:
            w.proc.join(5.0)
            w.conn.close()
        self.launcher.finish(workers, kill)
        with self.lock:
            self.workers = []
            self.running_attempt = 0
            self.running_changed.notify_all()
