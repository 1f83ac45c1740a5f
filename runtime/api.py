"""The job API: an execution environment and the streams built on it.

::

    env = StreamExecutionEnvironment(parallelism=2, checkpoint_interval_s=1.0, state_root=ROOT,
                                     restart_strategy=FixedDelay(attempts=10, delay_s=0.1))
    events = env.from_source(GeneratorSource(make_event, count=10_000, splits=4), uid="events",
                             watermarks=WatermarkStrategy(lambda e: e["ts"], 2_000))
    (events.key_by(lambda e: e["user"])
           .window(TumblingEventTimeWindows(10_000))
           .aggregate(Count(), uid="window-count", window_function=lambda k, w, n: [k, w.start, n])
           .sink_to(FileSink(OUT), uid="out"))
    result = env.execute("clicks")

Every stateful operator, source and sink needs a ``uid``: checkpoints match state and
positions by uid. Functions and objects of the job are shipped to worker processes with
pickle (cloudpickle for lambdas and closures).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from materializer.options import MaterializerOptions
from runtime.client import JobClient
from runtime.config import (
    CHANGELOG,
    STATE_BACKENDS,
    STATE_DUMP,
    SUPPORTED_MODES,
    CheckpointingMode,
    JobConfig,
)
from runtime.driver import JobMaster, JobResult
from runtime.errors import JobGraphError
from runtime.functions import KeyedCoProcessFunction, KeyedProcessFunction
from runtime.graph import FORWARD, HASH, InputEdge, StreamGraph, StreamNode
from runtime.operators import (
    FilterOperator,
    FlatMapOperator,
    KeyedProcessOperator,
    MapOperator,
    StreamOperator,
)
from runtime.restart import FixedDelay, NoRestart, RestartStrategy
from runtime.sinks import Sink
from runtime.sources import Source, WatermarkStrategy
from runtime.spark_cluster import SparkLauncher
from runtime.windows import WindowAssigner, WindowOperator
from statelog import options as opt
from statelog.checkpoint.writer_lease import DEFAULT_WRITER_LEASE_TTL_S
from statelog.descriptors import AggregateFunction
from statelog.keys import DEFAULT_MAX_PARALLELISM, check_max_parallelism, check_parallelism
from statelog.metrics import check_port
from statelog.options import WriterOptions
from statelog.store.options import StoreOptions, resolve_store_options
from statelog.types import PICKLE


class StreamExecutionEnvironment:
    """Builds a job graph and runs it on worker processes (see the module docstring)."""

    def __init__(
        self,
        parallelism: int = 1,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        checkpoint_interval_s: float | None = 1.0,
        checkpoint_timeout_s: float = 60.0,
        mode: str | CheckpointingMode = CheckpointingMode.EXACTLY_ONCE_ALIGNED,
        state_root: str | None = None,
        restart_strategy: RestartStrategy | None = None,
        tolerable_failed_checkpoints: int = 0,
        *,
        retain_checkpoints: int = 5,
        store_options: Mapping[str, Any] | None = None,
        writer_options: Mapping[str, Any] | WriterOptions | None = None,
        batch_size: int = 256,
        channel_capacity: int = 8,
        buffer_debloat_target: float | str | None = 1.0,
        max_inflight_bytes: int | str | None = None,
        start_method: str = "forkserver",
        materializer: bool | Mapping[str, Any] | MaterializerOptions | None = None,
        state_backend: str = "changelog",
        on_demand_restore: bool = True,
        state_store: str = "memory",
        state_memory: int | str = opt.DEFAULT_STATE_MEMORY,
        state_dir: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        writer_lease_ttl_s: float = DEFAULT_WRITER_LEASE_TTL_S,
    ) -> None:
        check_max_parallelism(max_parallelism)
        check_parallelism(parallelism, max_parallelism)
        try:
            mode = CheckpointingMode(mode)
        except ValueError:
            raise JobGraphError(
                f"unknown checkpointing mode {mode!r}; use one of {[m.value for m in CheckpointingMode]}"
            ) from None
        if mode not in SUPPORTED_MODES:
            raise JobGraphError(
                f"checkpointing mode {mode.value!r} is not implemented yet (docs/runtime.md); use one of "
                f"{[m.value for m in SUPPORTED_MODES]}"
            )
        if not state_root:
            raise JobGraphError("state_root is required: the job root URL, e.g. file:///var/lib/job")
        # ranges: statelog/options.py (docs/runtime.md lists them); a bad value is a ConfigError
        if checkpoint_interval_s is not None:
            checkpoint_interval_s = opt.CHECKPOINT_INTERVAL.check(checkpoint_interval_s)
        checkpoint_timeout_s = opt.CHECKPOINT_TIMEOUT.check(checkpoint_timeout_s)
        tolerable_failed_checkpoints = opt.TOLERABLE_FAILED_CHECKPOINTS.check(tolerable_failed_checkpoints)
        retain_checkpoints = opt.RETAIN.check(retain_checkpoints)
        batch_size = opt.BATCH_SIZE.check(batch_size)
        channel_capacity = opt.CHANNEL_CAPACITY.check(channel_capacity)
        if buffer_debloat_target is not None:  # None: debloating off
            buffer_debloat_target = opt.BUFFER_DEBLOAT_TARGET.check(buffer_debloat_target)
        if max_inflight_bytes is not None:  # None: no limit
            max_inflight_bytes = opt.MAX_INFLIGHT_BYTES.check(max_inflight_bytes)
        writer_options = WriterOptions.from_mapping(writer_options)
        if start_method not in ("spawn", "forkserver"):
            raise JobGraphError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        if state_backend not in STATE_BACKENDS:
            raise JobGraphError(
                f"unknown state_backend {state_backend!r}; use {CHANGELOG!r} (statelog) or {STATE_DUMP!r} "
                f"(the benchmark baseline; one of {list(STATE_BACKENDS)})"
            )
        if state_backend != CHANGELOG:  # the state-dump baseline (or its former name)
            if restart_strategy is not None and not isinstance(restart_strategy, NoRestart):
                raise JobGraphError(
                    f"state_backend={state_backend!r} is a benchmark baseline whose checkpoints cannot be "
                    "restored: it runs without restarts (leave restart_strategy unset)"
                )
            if materializer:
                raise JobGraphError(
                    f"state_backend={state_backend!r} writes no changelog: there is nothing to materialize"
                )
            if state_store != "memory":
                raise JobGraphError(
                    f"state_backend={state_backend!r} dumps the in-memory tables: use state_store='memory' with it"
                )
            restart_strategy = NoRestart()
        if materializer is True:
            materializer = {}
        elif materializer is False:
            materializer = None
        if materializer is not None and not isinstance(materializer, Mapping | MaterializerOptions):
            raise JobGraphError(
                "materializer must be True, False, None or a dict of materializer options "
                f"(interval_s, max_tail_bytes, ...), got {type(materializer).__name__}"
            )
        if materializer is not None:
            materializer = MaterializerOptions.from_mapping(materializer)  # names and ranges: one place
        self.config = JobConfig(
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            checkpoint_interval_s=checkpoint_interval_s,
            checkpoint_timeout_s=checkpoint_timeout_s,
            mode=mode,
            state_root=state_root,
            store_options=StoreOptions(store_options),
            writer_options=writer_options,
            retain_checkpoints=retain_checkpoints,
            tolerable_failed_checkpoints=tolerable_failed_checkpoints,
            batch_size=batch_size,
            channel_capacity=channel_capacity,
            buffer_debloat_target=buffer_debloat_target,
            max_inflight_bytes=max_inflight_bytes,
            start_method=start_method,
            materializer=materializer,
            state_backend=state_backend,
            on_demand_restore=bool(on_demand_restore),
            state_store=opt.check_state_store("state_store", state_store),
            state_memory=opt.STATE_MEMORY.check(state_memory),
            state_dir=opt.check_state_dir("state_dir", state_dir),
            metrics_port=check_port("metrics_port", metrics_port),
            metrics_host=opt.non_empty_name("metrics_host", metrics_host),
            writer_lease_ttl_s=opt.WRITER_LEASE_TTL.check(writer_lease_ttl_s),
        )
        self.restart_strategy = restart_strategy or FixedDelay(attempts=3, delay_s=1.0)
        self.graph = StreamGraph()

    # -- building ------------------------------------------------------------------------------

    def from_source(
        self,
        source: Source,
        uid: str,
        name: str | None = None,
        watermarks: WatermarkStrategy | None = None,
    ) -> DataStream:
        if not isinstance(source, Source):
            raise JobGraphError(f"from_source needs a runtime.Source, got {type(source).__name__}")
        node = self.graph.add(name=name or f"source:{uid}", uid=uid, inputs=[], source=source, watermarks=watermarks)
        return DataStream(self, ((node.id, FORWARD, None),))

    # -- running -------------------------------------------------------------------------------

    def execute_async(
        self,
        job_name: str = "job",
        *,
        restore: int | str | None = None,
        allow_non_restored_state: bool = False,
        cluster: str = "local",
        spark: Any = None,
    ) -> JobClient:
        """Start the job in a background thread of this process; returns its client.

        ``cluster="local"``: worker processes on this machine; ``cluster="spark"``: the workers
        run as the tasks of a Spark barrier stage on the cluster of ``spark`` (a SparkSession
        or SparkContext; default: the active session), see :mod:`runtime.spark_cluster`."""
        launcher = None
        config = self.config
        if cluster == "spark":
            launcher = SparkLauncher(spark, job_name)
            # executors may lack this process's AWS_* environment: they get the store options
            # it resolves (in the deploy spec, over the authenticated control connection)
            config = replace(config, store_options=resolve_store_options(config.state_root, config.store_options))
        elif cluster != "local":
            raise JobGraphError(f"cluster must be 'local' or 'spark', got {cluster!r}")
        elif spark is not None:
            raise JobGraphError("spark= is only used with cluster='spark'")
        if restore not in (None, "none") and self.config.state_backend != CHANGELOG:
            raise JobGraphError(
                f"state_backend={self.config.state_backend!r} (a benchmark baseline) cannot restore; "
                f"use the {CHANGELOG!r} backend"
            )
        master = JobMaster(
            job_name, self.graph, config, self.restart_strategy,
            restore=restore, allow_non_restored_state=allow_non_restored_state, launcher=launcher,
        )
        return JobClient.start(master)

    def execute(
        self,
        job_name: str = "job",
        *,
        restore: int | str | None = None,
        allow_non_restored_state: bool = False,
        timeout_s: float | None = None,
        cluster: str = "local",
        spark: Any = None,
    ) -> JobResult:
        """Run the job to the end of its (bounded) input; returns its result.

        ``restore`` is a retained checkpoint id, ``"latest"`` (empty state if there is no
        checkpoint yet), ``"savepoint:NAME"`` or ``"none"`` (start from empty state on purpose);
        the job may have another parallelism than the one that took it. Without ``restore`` a
        state root that already has checkpoints is refused with
        :class:`~statelog.errors.RestoreRequiredError` (naming the newest one): starting empty
        there would repeat the sinks' output. ``cluster``/``spark``: see :meth:`execute_async`.
        """
        client = self.execute_async(job_name, restore=restore, allow_non_restored_state=allow_non_restored_state,
                                    cluster=cluster, spark=spark)
        return client.wait(timeout_s)


Part = tuple[int, str, Callable[[Any], Any] | None]  # (node id, partitioning, key selector)


class DataStream:
    """A stream of records: the output of one node, or the union of several."""

    def __init__(self, env: StreamExecutionEnvironment, parts: tuple[Part, ...]) -> None:
        self.env = env
        self.parts = parts

    def _add(
        self,
        name: str,
        uid: str | None,
        operator: StreamOperator | None = None,
        sink: Sink | None = None,
        extra: Iterable[tuple[Part, int]] = (),
    ) -> StreamNode:
        inputs = [InputEdge(n, p, k, 0) for n, p, k in self.parts]
        inputs += [InputEdge(n, p, k, idx) for (n, p, k), idx in extra]
        return self.env.graph.add(name=name, uid=uid, inputs=inputs, operator=operator, sink=sink)

    def _one(self, op: StreamOperator, name: str, uid: str | None = None) -> DataStream:
        node = self._add(name, uid, op)
        return DataStream(self.env, ((node.id, FORWARD, None),))

    def map(self, fn: Callable[[Any], Any], name: str = "map") -> DataStream:
        return self._one(MapOperator(fn, name), name)

    def filter(self, fn: Callable[[Any], bool], name: str = "filter") -> DataStream:
        return self._one(FilterOperator(fn, name), name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any] | None], name: str = "flat_map") -> DataStream:
        return self._one(FlatMapOperator(fn, name), name)

    def key_by(self, key_selector: Callable[[Any], Any]) -> KeyedStream:
        """Partition by key: records with equal keys go to the same subtask (by key group)."""
        if not callable(key_selector):
            raise JobGraphError("key_by needs a callable key selector")
        return KeyedStream(self.env, tuple((n, HASH, key_selector) for n, _p, _k in self.parts))

    def union(self, *others: DataStream) -> DataStream:
        parts = list(self.parts)
        for o in others:
            if o.env is not self.env:
                raise JobGraphError("union of streams of different environments")
            parts.extend(o.parts)
        return DataStream(self.env, tuple(parts))

    def connect(self, other: DataStream) -> ConnectedStreams:
        return ConnectedStreams(self, other)

    def sink_to(self, sink: Sink, uid: str, name: str | None = None) -> None:
        if not isinstance(sink, Sink):
            raise JobGraphError(f"sink_to needs a runtime.Sink, got {type(sink).__name__}")
        self._add(name or f"sink:{uid}", uid, sink=sink)


class KeyedStream(DataStream):
    """A stream partitioned by key: keyed process functions and windows apply to it."""

    def process(self, fn: KeyedProcessFunction, uid: str, name: str | None = None) -> DataStream:
        if not isinstance(fn, KeyedProcessFunction):
            raise JobGraphError(f"process needs a KeyedProcessFunction, got {type(fn).__name__}")
        sel = self.parts[0][2]
        assert sel is not None
        name = name or f"process:{uid}"
        return self._one(KeyedProcessOperator(uid, fn, (sel,), name), name, uid)

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        if len({id(k) for _n, _p, k in self.parts}) != 1:
            raise JobGraphError("window needs one key selector")
        return WindowedStream(self, assigner)


class WindowedStream:
    def __init__(self, stream: KeyedStream, assigner: WindowAssigner) -> None:
        self.stream = stream
        self.assigner = assigner

    def _build(self, uid: str, name: str | None, **kw: Any) -> DataStream:
        sel = self.stream.parts[0][2]
        assert sel is not None
        name = name or f"window:{uid}"
        op = WindowOperator(uid, sel, self.assigner, name=name, **kw)
        return self.stream._one(op, name, uid)

    def reduce(
        self,
        reduce_fn: Callable[[Any, Any], Any],
        uid: str,
        *,
        window_function: Callable[[Any, Any, Any], Any] | None = None,
        value_type: Any = PICKLE,
        name: str | None = None,
    ) -> DataStream:
        """Fold each window's records with ``reduce_fn``; emit the result (or
        ``window_function(key, window, result)``) when the watermark passes the window."""
        return self._build(uid, name, reduce_fn=reduce_fn, window_function=window_function, value_type=value_type)

    def aggregate(
        self,
        aggregate: AggregateFunction,
        uid: str,
        *,
        window_function: Callable[[Any, Any, Any], Any] | None = None,
        accumulator_type: Any = PICKLE,
        name: str | None = None,
    ) -> DataStream:
        """Aggregate each window's records with ``aggregate`` (create_accumulator/add/get_result)."""
        return self._build(uid, name, aggregate=aggregate, window_function=window_function, value_type=accumulator_type)


class ConnectedStreams:
    """Two keyed streams processed together (``process_element1`` / ``process_element2``)."""

    def __init__(self, first: DataStream, second: DataStream) -> None:
        if not isinstance(first, KeyedStream) or not isinstance(second, KeyedStream):
            raise JobGraphError("connect: key both streams with key_by first (a keyed two-input operator)")
        self.first = first
        self.second = second

    def process(self, fn: KeyedCoProcessFunction, uid: str, name: str | None = None) -> DataStream:
        if not isinstance(fn, KeyedCoProcessFunction):
            raise JobGraphError(f"connect(...).process needs a KeyedCoProcessFunction, got {type(fn).__name__}")
        s1, s2 = self.first.parts[0][2], self.second.parts[0][2]
        assert s1 is not None and s2 is not None
        name = name or f"co-process:{uid}"
        op = KeyedProcessOperator(uid, fn, (s1, s2), name)
        node = self.first._add(name, uid, op, extra=[(p, 1) for p in self.second.parts])
        return DataStream(self.first.env, ((node.id, FORWARD, None),))
