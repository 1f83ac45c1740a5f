"""The job configuration: what the job master and every worker need besides the graph.

:class:`JobConfig` is built and validated by :class:`~runtime.api.environment.StreamExecutionEnvironment`
and pickled to the worker processes; the job master (:mod:`runtime.cluster.master`), the task
deployment (:mod:`runtime.worker.deploy`) and the workers read it. It sits below all of them so
that none of them imports the job API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from materializer.options import MaterializerOptions
from statelog import options as opt
from statelog.checkpoint.writer_lease import DEFAULT_WRITER_LEASE_TTL_S
from statelog.keys.groups import DEFAULT_MAX_PARALLELISM
from statelog.options import WriterOptions
from statelog.store.options import StoreOptions

# state backends (docs/runtime.md, "State backends")
CHANGELOG = "changelog"  # statelog: changelog checkpoints, restorable
STATE_DUMP = "state-dump"  # the benchmark baseline: every checkpoint dumps the whole state
FULL_SNAPSHOT = "full-snapshot"  # another name of the state-dump baseline, accepted as well
STATE_BACKENDS = (CHANGELOG, STATE_DUMP, FULL_SNAPSHOT)


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
    # "changelog" (statelog) or "state-dump" (the benchmark baseline, see docs/runtime.md;
    # "full-snapshot", its other name, is kept as given)
    state_backend: str = CHANGELOG
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
