"""Streaming runtime with barrier checkpoints hosting the statelog backend (issue #5).

Build a job with :class:`StreamExecutionEnvironment` (sources, map/filter/flat_map,
``key_by``, keyed process functions, windows, ``union``, ``connect``, sinks) and run it on
worker processes with :meth:`~StreamExecutionEnvironment.execute`. Design:
``docs/runtime.md``.
"""

from runtime.api import (
    CheckpointingMode,
    ConnectedStreams,
    DataStream,
    KeyedStream,
    StreamExecutionEnvironment,
    WindowedStream,
)
from runtime.client import JobClient
from runtime.driver import JobResult
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
from runtime.functions import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ProcessContext,
)
from runtime.restart import ExponentialBackoff, FailureRate, FixedDelay, NoRestart, RestartStrategy
from runtime.sinks import CollectSink, FileSink, PrintSink, Sink, committed_files, read_committed
from runtime.sources import FileSource, GeneratorSource, ParquetSource, Source, WatermarkStrategy
from runtime.windows import SlidingEventTimeWindows, TimeWindow, TumblingEventTimeWindows

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
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
    "PrintSink",
    "ProcessContext",
    "RestartStrategy",
    "RuntimeJobError",
    "Sink",
    "SlidingEventTimeWindows",
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
