"""The job master: deploys the job on worker processes, runs the checkpoint coordinator,
detects failures and restarts the job from its latest completed checkpoint.

One attempt of a job:

1. sinks recover (commit the pending transactions of checkpoints ``<=`` the one restored,
   abort the rest);
2. the launcher (:mod:`runtime.cluster.launcher`) starts ``parallelism`` workers: local processes
   (``multiprocessing``, ``forkserver`` by default with the runtime preloaded, or ``spawn``)
   or the tasks of a Spark barrier stage (:mod:`runtime.cluster.spark`); each opens a
   listening socket and reports it. Every connection proves knowledge of the run's job
   secret first (:mod:`runtime.network.auth`);
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

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import cloudpickle

from materializer import BackgroundMaterializer, start_background
from runtime.cluster.control import WorkerControl
from runtime.cluster.coordinator import CheckpointCoordinator
from runtime.cluster.final_materialization import FinalMaterialization
from runtime.cluster.launcher import Launcher, LocalLauncher, WorkerProc
from runtime.cluster.metrics import JobMetrics
from runtime.cluster.restart import RestartStrategy
from runtime.cluster.restore_plan import (
    check_fresh_start,
    check_restore,
    restore_ref,
    split_assignments,
)
from runtime.cluster.savepoints import Savepoints
from runtime.config import CHANGELOG, JobConfig
from runtime.errors import JobCancelledError, JobFailedError, RuntimeJobError, WorkerLostError
from runtime.graph import JobGraph, StreamGraph
from runtime.network.auth import new_secret
from runtime.network.inflight import collect_inflight
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import FencedError, StatelogError
from statelog.job import StateJob
from statelog.metrics import MetricsServer

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0


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
    """Pickle the job graph with cloudpickle: what the user's main module defines (functions,
    lambdas, classes) travels by value, since workers never import that module."""
    return cloudpickle.dumps(graph, protocol=5)


def serialize_config(config: JobConfig) -> bytes:
    """Pickle the job's configuration by value like its graph (:func:`serialize_graph`): a
    snapshot strategy or another object of a class the user's main module defines reaches
    the workers."""
    return cloudpickle.dumps(config, protocol=5)


class JobMaster(WorkerControl):
    """Runs one job: its attempts, each on a fresh set of workers, until the job ends, is
    cancelled, or fails beyond its restart strategy (see the module docstring). Its dealings
    with the workers are :class:`~runtime.cluster.control.WorkerControl`'s, its savepoints
    :class:`~runtime.cluster.savepoints.Savepoints`'."""

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
        self.savepoints = Savepoints()
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
                f"state_backend={self.config.state_backend!r} is a snapshot strategy: it takes no savepoints"
            )
        return self.savepoints.request(name, stop)

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
                self.metrics_server = MetricsServer(self.metrics.registry, self.metrics.health, cfg.metrics_host,
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
                check_fresh_start(self.job, self.name)
            meta = self.job.resolve_checkpoint(self.restore)
            if self.restore not in (None, "none") and meta is None:
                log.info("restore=%r: no checkpoint yet, starting empty", self.restore)
            if meta is not None:
                check_restore(meta, self.job_graph.stream, self.allow_non_restored_state)
            for node in self.job_graph.stream.nodes:
                if node.source is not None:
                    node.source.check()  # a misconfigured source fails the job now, not through restarts
            ref: int | str | None = restore_ref(self.restore, meta)
            self.next_id = self.job.next_checkpoint_id()
            if meta is not None:
                self.next_id = max(self.next_id, meta.checkpoint_id + 1)
            self.first_id = self.next_id  # checkpoints of this run have ids >= first_id
            final = None
            while True:
                self.attempt += 1
                try:
                    final = self._run_attempt(ref, meta)
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
                    self.job.checkpoint_history.record_restart(self.attempt, reason)  # never raises
                    log.warning(
                        "attempt %d failed (%s); restarting in %.2fs (teardown took %.2fs)",
                        self.attempt, reason, delay, time.monotonic() - t_fail,
                    )
                    if self._cancel.wait(delay):
                        raise JobCancelledError(f"job {self.name!r} was cancelled") from exc
                    latest = self._latest_completed()
                    if latest is not None:
                        meta = self.job.load_checkpoint(latest)
                        ref = meta.checkpoint_id
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
                savepoint=self.savepoints.stopped_with.name if self.savepoints.stopped_with is not None else None,
                restore_stats=self.restore_stats,
            )
        finally:
            self.savepoints.fail_left(self.name)
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

    def _latest_completed(self) -> int | None:
        """The newest checkpoint of this run: the catalog is the truth (a checkpoint exists
        once its metadata does), whatever happened between its publish and its notification."""
        ids = [i for i in self.job.catalog.checkpoint_ids() if i >= self.first_id]
        with self.lock:
            ids += self.completed
        return max(ids) if ids else None

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
        assignments = split_assignments(self.job_graph.stream, cfg.parallelism, meta)
        config_bytes = serialize_config(cfg)
        for w in workers:
            spec = {
                "config": config_bytes,
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
            self.job, set(self.task_keys), interval_s=cfg.checkpoint_interval_s, timeout_s=cfg.checkpoint_timeout_s,
            tolerable_failures=cfg.tolerable_failed_checkpoints, first_id=self.next_id, broadcast=self._broadcast,
            on_complete=self._on_complete, attempt=self.attempt, state_backend=cfg.state_backend,
            mode=cfg.mode.value, previous=meta, max_inflight_bytes=cfg.max_inflight_bytes,
        )  # fmt: skip
        if self._materializer is not None and cfg.materialize_before_final:
            self.coordinator.final_gate = FinalMaterialization(
                self._materializer, self.coordinator, self._latest_completed, self._broadcast, cfg.checkpoint_timeout_s
            ).ready
        if self._finished >= self.source_task_keys:
            self.coordinator.request_final()
        if self.savepoints.stopping():
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
                if self.savepoints.service(self.coordinator):
                    stopped = self.savepoints.stopped_with
                    assert stopped is not None and stopped.checkpoint_id is not None
                    return stopped.checkpoint_id
                now = time.monotonic()
                self.coordinator.tick(now)
                self._poll(min(0.2, self.coordinator.next_wakeup(time.monotonic())))
        finally:
            self.next_id = self.coordinator.next_id
            self.failed_checkpoints += self.coordinator.failed_total
            self.coordinator.failed_total = 0
        return self.coordinator.final_completed

    def _on_complete(self, meta: CheckpointMetadata) -> None:
        cid = meta.checkpoint_id
        with self.lock:
            self.completed.append(cid)
        self.stats[cid] = dict(meta.stats)
        self.metrics.observe_checkpoint(cid, meta.stats, meta.changelog_bytes, meta.timestamp_ms)
        self.savepoints.on_complete(cid, self.coordinator, self.job.store)
        self._collect_committed(cid)
        try:  # in-flight data (unaligned checkpoints) of checkpoints no longer retained
            collect_inflight(self.job.store, self.job.catalog.checkpoint_ids(), cid)
        except Exception as e:  # noqa: BLE001 - garbage only; the next checkpoint tries again
            log.warning("could not delete old in-flight data: %s", e)
