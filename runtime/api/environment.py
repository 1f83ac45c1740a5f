"""The job API's entry: the execution environment (settings, sources, running the job).

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
pickle (cloudpickle for lambdas and closures). The streams: :mod:`runtime.api.datastream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from materializer.options import MaterializerOptions
from runtime.api.batches import DEFAULT_BATCH_ROWS, check_batch_source
from runtime.api.datastream import DataStream
from runtime.cluster.client import JobClient
from runtime.cluster.master import JobMaster, JobResult
from runtime.cluster.restart import FixedDelay, NoRestart, RestartStrategy
from runtime.cluster.spark import SparkLauncher
from runtime.config import CHANGELOG, CheckpointingMode, JobConfig, SnapshotStrategy
from runtime.connectors.sources import Source, WatermarkStrategy
from runtime.errors import JobGraphError
from runtime.graph import FORWARD, StreamGraph
from statelog.keys.groups import check_max_parallelism, check_parallelism
from statelog.options.engine import WriterOptions
from statelog.store.options import StoreOptions, resolve_store_options


class StreamExecutionEnvironment:
    """Builds a job graph and runs it on worker processes (see the module docstring)."""

    def __init__(
        self,
        parallelism: int = JobConfig.parallelism,
        max_parallelism: int = JobConfig.max_parallelism,
        checkpoint_interval_s: float | None = JobConfig.checkpoint_interval_s,
        checkpoint_timeout_s: float = JobConfig.checkpoint_timeout_s,
        mode: str | CheckpointingMode = JobConfig.mode,
        state_root: str | None = None,
        restart_strategy: RestartStrategy | None = None,
        tolerable_failed_checkpoints: int = JobConfig.tolerable_failed_checkpoints,
        *,
        # the defaults are JobConfig's (one source); None for the objects JobConfig builds itself
        retain_checkpoints: int = JobConfig.retain_checkpoints,
        store_options: Mapping[str, Any] | None = None,
        writer_options: Mapping[str, Any] | WriterOptions | None = None,
        batch_size: int = JobConfig.batch_size,
        channel_capacity: int = JobConfig.channel_capacity,
        buffer_debloat_target: float | str | None = JobConfig.buffer_debloat_target,
        max_inflight_bytes: int | str | None = JobConfig.max_inflight_bytes,
        start_method: str = JobConfig.start_method,
        materializer: bool | Mapping[str, Any] | MaterializerOptions | None = JobConfig.materializer,
        materialize_before_final: bool = JobConfig.materialize_before_final,
        state_backend: str | SnapshotStrategy = JobConfig.state_backend,
        on_demand_restore: bool = JobConfig.on_demand_restore,
        state_store: str = JobConfig.state_store,
        state_memory: int | str = JobConfig.state_memory,
        state_dir: str | None = JobConfig.state_dir,
        local_copies: bool | str | Mapping[str, Any] | None = JobConfig.local_copies,
        metrics_port: int | None = JobConfig.metrics_port,
        metrics_host: str = JobConfig.metrics_host,
        writer_lease_ttl_s: float = JobConfig.writer_lease_ttl_s,
    ) -> None:
        check_max_parallelism(max_parallelism)
        check_parallelism(parallelism, max_parallelism)
        mode = JobConfig.check_field("mode", mode)
        if not state_root:
            raise JobGraphError("state_root is required: the job root URL, e.g. file:///var/lib/job")
        # each option's default, doc and range: runtime.config.JobConfig (docs/runtime.md lists them); a
        # bad value is a ConfigError. The ones the checks below depend on are checked first.
        JobConfig.check_field("start_method", start_method)
        # state_backend: "changelog" or a SnapshotStrategy (runtime.config), e.g. a benchmark baseline
        strategy = state_backend if isinstance(state_backend, SnapshotStrategy) else None
        if strategy is None and state_backend != CHANGELOG:
            raise JobGraphError(
                f"unknown state_backend {state_backend!r}; use {CHANGELOG!r} (statelog) or a "
                "runtime.SnapshotStrategy (a benchmark baseline)"
            )
        if strategy is not None:
            state_backend = strategy.name
            if state_backend == CHANGELOG:
                raise JobGraphError(f"a snapshot strategy cannot be named {CHANGELOG!r}")
            if restart_strategy is not None and not isinstance(restart_strategy, NoRestart):
                raise JobGraphError(
                    f"state_backend={state_backend!r} takes checkpoints that cannot be restored: "
                    "it runs without restarts (leave restart_strategy unset)"
                )
            if materializer:
                raise JobGraphError(
                    f"state_backend={state_backend!r} writes no changelog: there is nothing to materialize"
                )
            if state_store != "memory":
                raise JobGraphError(
                    f"state_backend={state_backend!r} snapshots the in-memory tables: use state_store='memory' with it"
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
            materialize_before_final=materialize_before_final,
            state_backend=state_backend,
            snapshot_strategy=strategy,
            on_demand_restore=bool(on_demand_restore),
            state_store=state_store,
            state_memory=state_memory,
            state_dir=state_dir,
            local_copies=local_copies,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            writer_lease_ttl_s=writer_lease_ttl_s,
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
        *,
        batches: bool = False,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> DataStream:
        """The stream of ``source``'s records; ``batches=True``: of Arrow record batches of up
        to ``batch_rows`` rows each (see :mod:`runtime.api.batches`)."""
        if not isinstance(source, Source):
            raise JobGraphError(f"from_source needs a runtime.Source, got {type(source).__name__}")
        rows = check_batch_source(batches, batch_rows, watermarks)
        node = self.graph.add(name=name or f"source:{uid}", uid=uid, inputs=[], source=source, watermarks=watermarks,
                              batch_rows=rows)  # fmt: skip
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
        or SparkContext; default: the active session), see :mod:`runtime.cluster.spark`."""
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
                f"state_backend={self.config.state_backend!r} (a snapshot strategy) cannot restore; "
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
