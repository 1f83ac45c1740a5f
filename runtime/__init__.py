"""Streaming runtime with barrier checkpoints hosting the statelog backend.

Build a job with :class:`StreamExecutionEnvironment` (sources, map/filter/flat_map,
``key_by``, keyed process functions, windows, ``union``, ``connect``, sinks) and run it on
worker processes with :meth:`~StreamExecutionEnvironment.execute`. Design:
``docs/runtime.md``.

The packages: :mod:`runtime.api` (what a job is built of), :mod:`runtime.app` (a Kafka
consumer loop with keyed state in one process, :class:`Application`), :mod:`runtime.cluster` (the job
master), :mod:`runtime.worker` (a worker process), :mod:`runtime.task` (what a worker
runs), :mod:`runtime.network` (channels between tasks), :mod:`runtime.connectors` (sources
and sinks, Kafka); :mod:`runtime.graph` (the stream and job graphs), :mod:`runtime.config`
and :mod:`runtime.errors` sit below them.

The names below are exported lazily (PEP 562): ``from runtime import Application`` imports
:mod:`runtime.app` and what it needs, not the job master, the workers or the network;
``tests/architecture/test_startup_imports.py`` checks it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.api.datastream import ConnectedStreams, DataStream, KeyedStream, WindowedStream
    from runtime.api.environment import StreamExecutionEnvironment
    from runtime.api.functions import (
        MAX_WATERMARK,
        MIN_WATERMARK,
        KeyedCoProcessFunction,
        KeyedProcessFunction,
        ProcessContext,
    )
    from runtime.api.windows import SlidingEventTimeWindows, TimeWindow, TumblingEventTimeWindows
    from runtime.app import Application, ApplicationOptions
    from runtime.cluster.client import JobClient
    from runtime.cluster.master import JobResult
    from runtime.cluster.restart import (
        ExponentialBackoff,
        FailureRate,
        FixedDelay,
        NoRestart,
        RestartStrategy,
    )
    from runtime.config import CheckpointingMode, PendingStrategySnapshot, SnapshotStrategy
    from runtime.connectors.file_source import FileSource
    from runtime.connectors.parquet_source import ParquetSource
    from runtime.connectors.sinks import (
        CollectSink,
        FileSink,
        PrintSink,
        Sink,
        committed_files,
        read_committed,
    )
    from runtime.connectors.sources import GeneratorSource, Source, WatermarkStrategy
    from runtime.errors import (
        CheckpointFailureLimitError,
        JobCancelledError,
        JobFailedError,
        JobGraphError,
        NonRestoredStateError,
        RuntimeJobError,
        TaskFailedError,
        WorkerLostError,
    )

# exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "ConnectedStreams": "runtime.api.datastream",
    "DataStream": "runtime.api.datastream",
    "KeyedStream": "runtime.api.datastream",
    "WindowedStream": "runtime.api.datastream",
    "StreamExecutionEnvironment": "runtime.api.environment",
    "MAX_WATERMARK": "runtime.api.functions",
    "MIN_WATERMARK": "runtime.api.functions",
    "KeyedCoProcessFunction": "runtime.api.functions",
    "KeyedProcessFunction": "runtime.api.functions",
    "ProcessContext": "runtime.api.functions",
    "SlidingEventTimeWindows": "runtime.api.windows",
    "TimeWindow": "runtime.api.windows",
    "TumblingEventTimeWindows": "runtime.api.windows",
    "Application": "runtime.app",
    "ApplicationOptions": "runtime.app",
    "JobClient": "runtime.cluster.client",
    "JobResult": "runtime.cluster.master",
    "ExponentialBackoff": "runtime.cluster.restart",
    "FailureRate": "runtime.cluster.restart",
    "FixedDelay": "runtime.cluster.restart",
    "NoRestart": "runtime.cluster.restart",
    "RestartStrategy": "runtime.cluster.restart",
    "CheckpointingMode": "runtime.config",
    "PendingStrategySnapshot": "runtime.config",
    "SnapshotStrategy": "runtime.config",
    "FileSource": "runtime.connectors.file_source",
    "ParquetSource": "runtime.connectors.parquet_source",
    "CollectSink": "runtime.connectors.sinks",
    "FileSink": "runtime.connectors.sinks",
    "PrintSink": "runtime.connectors.sinks",
    "Sink": "runtime.connectors.sinks",
    "committed_files": "runtime.connectors.sinks",
    "read_committed": "runtime.connectors.sinks",
    "GeneratorSource": "runtime.connectors.sources",
    "Source": "runtime.connectors.sources",
    "WatermarkStrategy": "runtime.connectors.sources",
    "CheckpointFailureLimitError": "runtime.errors",
    "JobCancelledError": "runtime.errors",
    "JobFailedError": "runtime.errors",
    "JobGraphError": "runtime.errors",
    "NonRestoredStateError": "runtime.errors",
    "RuntimeJobError": "runtime.errors",
    "TaskFailedError": "runtime.errors",
    "WorkerLostError": "runtime.errors",
}


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first use and cache the name in this module."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "Application",
    "ApplicationOptions",
    "CheckpointFailureLimitError",
    "CheckpointingMode",
    "CollectSink",
    "ConnectedStreams",
    "DataStream",
    "ExponentialBackoff",
    "FailureRate",
    "FileSink",
    "FileSource",
    "FixedDelay",
    "GeneratorSource",
    "JobCancelledError",
    "JobClient",
    "JobFailedError",
    "JobGraphError",
    "JobResult",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "NoRestart",
    "NonRestoredStateError",
    "ParquetSource",
    "PendingStrategySnapshot",
    "PrintSink",
    "ProcessContext",
    "RestartStrategy",
    "RuntimeJobError",
    "Sink",
    "SlidingEventTimeWindows",
    "SnapshotStrategy",
    "Source",
    "StreamExecutionEnvironment",
    "TaskFailedError",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "WatermarkStrategy",
    "WindowedStream",
    "WorkerLostError",
    "committed_files",
    "read_committed",
]
