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
"""

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
