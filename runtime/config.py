"""The runtime's options: the job configuration, what the job master and every worker need besides the graph.

:class:`JobConfig` holds every option of a job with its default, its one-line doc and its check (the
ranges below; ``docs/runtime.md`` lists them). It is built by
:class:`~runtime.api.environment.StreamExecutionEnvironment` from its keyword arguments, which name
the options in errors, and pickled to the worker processes; the job master (:mod:`runtime.cluster.master`), the task
deployment (:mod:`runtime.worker.deploy`) and the workers read it. It sits below all of them so
that none of them imports the job API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol, runtime_checkable

from materializer.options import MaterializerOptions
from runtime.errors import JobGraphError
from statelog.checkpoint.writer_lease import DEFAULT_WRITER_LEASE_TTL_S
from statelog.errors import ConfigError
from statelog.keys.groups import DEFAULT_MAX_PARALLELISM, MAX_MAX_PARALLELISM
from statelog.options.base import Options, check_bool, option
from statelog.options.engine import (
    DEFAULT_STATE_MEMORY,
    RETAIN,
    STATE_MEMORY,
    WRITER_LEASE_TTL,
    WriterOptions,
    check_state_dir,
    check_state_store,
)
from statelog.options.values import DAY, MS, Count, Duration, Size, check_port, non_empty_name
from statelog.state.backend import KeyedStateBackend
from statelog.store.base import ObjectStore
from statelog.store.local_copies import local_copies_setting
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
    costs with statelog's (``bench/baselines/``). The strategy travels to the workers by value
    (cloudpickle, with the job's configuration): its class may be defined in the job's script.
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


# the ranges of the runtime's own options
PARALLELISM = Count("parallelism", 1, MAX_MAX_PARALLELISM)
CHECKPOINT_INTERVAL = Duration("checkpoint_interval_s", 10 * MS, DAY)
CHECKPOINT_TIMEOUT = Duration("checkpoint_timeout_s", 1 * MS, DAY)
TOLERABLE_FAILED_CHECKPOINTS = Count("tolerable_failed_checkpoints", 0, 1_000_000)
BATCH_SIZE = Count("batch_size", 1, 1 << 20)
CHANNEL_CAPACITY = Count("channel_capacity", 1, 1 << 16)
BUFFER_DEBLOAT_TARGET = Duration("buffer_debloat_target", 1 * MS, 60.0)
MAX_INFLIGHT_BYTES = Size("max_inflight_bytes", 1, 1 << 40)  # in-flight data one unaligned checkpoint persists
START_METHODS = ("spawn", "forkserver")


def check_mode(label: str, value: Any) -> CheckpointingMode:
    try:
        mode = CheckpointingMode(value)
    except ValueError:
        raise JobGraphError(
            f"unknown checkpointing mode {value!r}; use one of {[m.value for m in CheckpointingMode]}"
        ) from None
    if mode not in SUPPORTED_MODES:
        raise JobGraphError(
            f"checkpointing mode {mode.value!r} is not implemented yet (docs/runtime.md); use one of "
            f"{[m.value for m in SUPPORTED_MODES]}"
        )
    return mode


def check_state_backend(label: str, value: Any) -> str:
    """``"changelog"`` or the name of a :class:`SnapshotStrategy` (the environment checks the object)."""
    if not isinstance(value, str) or not value:
        raise JobGraphError(f"{label} must be {CHANGELOG!r} or the name of a runtime.SnapshotStrategy, got {value!r}")
    return value


def _check_strategy(label: str, value: Any) -> SnapshotStrategy:
    if not isinstance(value, SnapshotStrategy):
        raise JobGraphError(f"{label} must be a runtime.SnapshotStrategy, got {type(value).__name__}")
    return value


def check_start_method(label: str, value: Any) -> str:
    if value not in START_METHODS:
        raise JobGraphError(f"start_method must be 'spawn' or 'forkserver', got {value!r}")
    return value


def _check_str(label: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{label} must be a str, got {type(value).__name__}")
    return value


def _check_store_options(label: str, value: Any) -> StoreOptions:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{label} must be a dict of store options, got {type(value).__name__}")
    return value if isinstance(value, StoreOptions) else StoreOptions(value)


def _check_writer_options(label: str, value: Any) -> WriterOptions:
    return WriterOptions.from_mapping(value)


def _check_materializer(label: str, value: Any) -> MaterializerOptions:
    return MaterializerOptions.from_mapping(value)


def _check_log_level(label: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{label} must be a logging level (an int) or None, got {value!r}")
    return value


@dataclass(frozen=True)
class JobConfig(Options):
    """Every option of a job: what workers and the job master need besides the graph (picklable).

    :class:`~runtime.api.environment.StreamExecutionEnvironment` takes them as keyword arguments
    (``docs/runtime.md`` lists them)."""

    KIND: ClassVar[str] = "runtime option"

    parallelism: int = option(1, "subtasks of each operator", PARALLELISM)
    max_parallelism: int = option(DEFAULT_MAX_PARALLELISM, "key groups: the most subtasks a keyed operator may "
                                  "ever be rescaled to", PARALLELISM)
    checkpoint_interval_s: float | None = option(1.0, "seconds between checkpoints (None: no periodic "
                                                 "checkpoints)", CHECKPOINT_INTERVAL, none_ok=True)
    checkpoint_timeout_s: float = option(60.0, "a checkpoint not complete after this long fails",
                                         CHECKPOINT_TIMEOUT)
    mode: CheckpointingMode = option(CheckpointingMode.EXACTLY_ONCE_ALIGNED, "checkpointing mode", check_mode)
    state_root: str = option("", "the job root URL, e.g. file:///var/lib/job", _check_str)
    store_options: StoreOptions = option(StoreOptions(), "options of the store of state_root (repr shows *** "
                                         "for secrets)", _check_store_options)
    writer_options: WriterOptions = option(WriterOptions(), "the changelog writer's options",
                                           _check_writer_options)
    retain_checkpoints: int = option(5, "completed checkpoints kept", RETAIN)
    tolerable_failed_checkpoints: int = option(0, "checkpoints that may fail in a row before the job fails",
                                               TOLERABLE_FAILED_CHECKPOINTS)
    batch_size: int = option(256, "records per frame between tasks", BATCH_SIZE)
    channel_capacity: int = option(8, "frames queued per channel before back-pressure", CHANNEL_CAPACITY)
    buffer_debloat_target: float | None = option(
        1.0, "buffer debloating (runtime/network/debloat.py): a channel holds what its consumer takes in this "
        "many seconds (None: off, channels hold channel_capacity frames plus the TCP buffers)",
        BUFFER_DEBLOAT_TARGET, none_ok=True)
    max_inflight_bytes: int | None = option(None, "the most in-flight data (bytes) one unaligned checkpoint "
                                            "may persist (None: no limit)", MAX_INFLIGHT_BYTES)
    start_method: str = option("forkserver", "how worker processes start: spawn or forkserver",
                               check_start_method)
    worker_log_level: int | None = option(None, "logging level of the worker processes (None: inherited)",
                                          _check_log_level)
    materializer: MaterializerOptions | None = option(None, "options of a background materializer run by the "
                                                      "job master (None: none runs)", _check_materializer)
    materialize_before_final: bool = option(True, "with a materializer: once every source finished, materialize "
                                            "the state before the final checkpoint, so that it builds on "
                                            "Parquet tables (runtime/cluster/final_materialization.py)",
                                            check_bool)
    state_backend: str = option(CHANGELOG, '"changelog" (statelog) or the name of snapshot_strategy '
                                '(docs/runtime.md, "State backends")', check_state_backend)
    snapshot_strategy: SnapshotStrategy | None = option(None, "how keyed state is checkpointed without the "
                                                        "changelog (a benchmark baseline; None: the changelog)",
                                                        _check_strategy)
    on_demand_restore: bool = option(True, "restore keyed state by key group on first use "
                                     "(statelog/restore/ondemand/) instead of all of it before the first "
                                     "record", check_bool)
    state_store: str = option("memory", 'where keyed state lives: "memory" (Python dicts) or "disk" (RocksDB '
                              "under a cache of state_memory bytes per task, statelog/state/tables/disk/), in "
                              "directories under state_dir", check_state_store)
    state_memory: int = option(DEFAULT_STATE_MEMORY, "the cache of a disk store per task", STATE_MEMORY)
    state_dir: str | None = option(None, "local directory of the disk stores", check_state_dir)
    local_copies: bool | dict[str, Any] | None = option(True, "keep the changelog segments, tables and manifests "
                                                        "each worker writes or reads in a local directory and "
                                                        "restore from them first: True (the default: "
                                                        "$XDG_CACHE_HOME/statelog/copies, 1 GiB), a directory or "
                                                        "a dict with directory and budget_bytes "
                                                        "(statelog/store/local_copies.py); False or None: off",
                                                        lambda label, v: local_copies_setting(v, label))
    metrics_port: int | None = option(None, "Prometheus metrics at /metrics and a health probe at /healthz "
                                      "of the job master (statelog/metrics.py); None: off, 0: any free port",
                                      check_port)
    metrics_host: str = option("127.0.0.1", "address the metrics port listens on", non_empty_name)
    writer_lease_ttl_s: float = option(DEFAULT_WRITER_LEASE_TTL_S, "how long the job master may stall (GC "
                                       "pause, SIGSTOP, frozen VM) before it loses the root's writer lease for "
                                       "good (statelog/checkpoint/writer_lease.py; docs/store.md)",
                                       WRITER_LEASE_TTL)

    @classmethod
    def label(cls, name: str) -> str:
        return name  # the environment's keyword arguments: errors name them as they are spelled
