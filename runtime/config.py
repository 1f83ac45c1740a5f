"""The job configuration: what the job master and every worker need besides the graph.

:class:`JobConfig` is built and validated by :class:`~runtime.api.environment.StreamExecutionEnvironment`
and pickled to the worker processes; the job master (:mod:`runtime.cluster.master`), the task
deployment (:mod:`runtime.worker.deploy`) and the workers read it. It sits below all of them so
that none of them imports the job API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from materializer.options import MaterializerOptions
from statelog import options as opt
from statelog.backend import KeyedStateBackend
from statelog.checkpoint.writer_lease import DEFAULT_WRITER_LEASE_TTL_S
from statelog.keys import DEFAULT_MAX_PARALLELISM
from statelog.options import WriterOptions
from statelog.store.base import ObjectStore
from statelog.store.options import StoreOptions

# the state backend (docs/runtime.md, "State backends"): statelog's changelog checkpoints,
# restorable; or a SnapshotStrategy given to the environment
CHANGELOG = "changelog"


class PendingStrategySnapshot(Protocol):
    """The asynchronous part of one keyed backend's checkpoint taken by a :class:`SnapshotStrategy`."""

    nbytes: int  # bytes written once result() returned (the checkpoint's bytes_uploaded)

    def result(self, timeout: float | None = None) -> None:
        """Write the captured state (on the worker's snapshot pool)."""
        ...

    def cancel(self) -> None:
        """The checkpoint was aborted before :meth:`result` ran."""
        ...


@runtime_checkable
class SnapshotStrategy(Protocol):
    """How keyed state is checkpointed when a job does not use statelog's changelog.

    ``StreamExecutionEnvironment(state_backend=strategy)`` runs the job on in-memory keyed
    backends with the changelog switched off; at every barrier a keyed operator calls
    :meth:`snapshot` on the task thread and the worker's snapshot pool calls the result's
    ``result()``. Such checkpoints are coordinated, timed and complete the sinks' transactions,
    but they are not published as statelog checkpoints: the job runs without restarts,
    restore, savepoints and materializer. The benchmarks use it to compare other checkpoint
    costs with statelog's (``bench/baselines/``). The strategy is pickled to the workers.
    """

    name: str  # shown as the checkpoints' "state_backend" statistic

    def snapshot(self, backend: KeyedStateBackend, checkpoint_id: int, store: ObjectStore) -> PendingStrategySnapshot:
        """Capture ``backend``'s state for ``checkpoint_id`` (synchronous part, task thread)."""
        ...

    def checkpoint_completed(self, backend: KeyedStateBackend, checkpoint_id: int, store: ObjectStore) -> None:
        """``checkpoint_id`` completed: clean up what older checkpoints wrote (best effort)."""
        ...


class CheckpointingMode(StrEnum):
    EXACTLY_ONCE_ALIGNED = "exactly_once_aligned"
    EXACTLY_ONCE_UNALIGNED = "exactly_once_unaligned"
    AT_LEAST_ONCE = "at_least_once"


SUPPORTED_MODES = (
    CheckpointingMode.EXACTLY_ONCE_ALIGNED,
    CheckpointingMode.EXACTLY_ONCE_UNALIGNED,
    CheckpointingMode.AT_LEAST_ONCE,
)


@dataclass
class JobConfig:
    """Everything workers and the job master need besides the graph (picklable)."""

    parallelism: int = 1
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    checkpoint_interval_s: float | None = 1.0
    checkpoint_timeout_s: float = 60.0
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE_ALIGNED
    state_root: str = ""
    store_options: StoreOptions = field(default_factory=StoreOptions)  # repr shows *** for secrets
    writer_options: WriterOptions = field(default_factory=WriterOptions)
    retain_checkpoints: int = 5
    tolerable_failed_checkpoints: int = 0
    batch_size: int = 256
    channel_capacity: int = 8  # frames queued per channel before back-pressure
    # buffer debloating (runtime/network/debloat.py): a channel holds what its consumer takes in this
    # many seconds (None: off, channels hold channel_capacity frames plus the TCP buffers)
    buffer_debloat_target: float | None = 1.0
    # the most in-flight data (bytes) one unaligned checkpoint may persist (None: no limit)
    max_inflight_bytes: int | None = None
    start_method: str = "forkserver"
    worker_log_level: int | None = None
    # options of a background materializer run by the job master (None: none runs)
    materializer: MaterializerOptions | None = None
    # "changelog" (statelog) or the name of snapshot_strategy (docs/runtime.md, "State backends")
    state_backend: str = CHANGELOG
    snapshot_strategy: SnapshotStrategy | None = None
    # restore keyed state by key group on first use (statelog/restore/ondemand/) instead of all of
    # it before the first record
    on_demand_restore: bool = True
    # where keyed state lives: "memory" (Python dicts) or "disk" (RocksDB under a cache of
    # state_memory bytes per task, statelog/state/tables/disk/), in directories under state_dir
    state_store: str = "memory"
    state_memory: int = opt.DEFAULT_STATE_MEMORY
    state_dir: str | None = None
    # Prometheus metrics at /metrics and a health probe at /healthz of the job master
    # (statelog/metrics.py); None: off, 0: any free port
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # how long the job master may stall (GC pause, SIGSTOP, frozen VM) before it loses the
    # root's writer lease for good (statelog/checkpoint/writer_lease.py; docs/store.md)
    writer_lease_ttl_s: float = DEFAULT_WRITER_LEASE_TTL_S
