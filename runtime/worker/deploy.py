"""Deploying a worker's tasks: from the job graph to tasks wired by channels.

Worker ``i`` runs subtask ``i`` of every vertex of the job graph (slot sharing).
:func:`build_tasks` builds them in three steps:

1. :func:`open_inputs`: the input channels of every local task, registered with the
   worker's channel server before anything sends (peers connect to them by
   ``(edge, source subtask, target subtask)``);
2. :func:`build_router`: each vertex's outputs, per edge and target subtask a
   :class:`~runtime.network.outputs.LocalOutput` into this worker's input channel or a
   :class:`~runtime.network.outputs.RemoteOutput` (a sender thread) to a peer's;
3. :func:`build_chain`: the vertex's operators in chain order (a sink creates its operator),
   each set up with a :class:`SubtaskContext` and the next operator (or the router) as output;

then it creates the :class:`~runtime.task.task.Task` (a source task with its splits, or an input
task with its channels) and hands a task restored from an unaligned checkpoint its
in-flight data. Nothing here runs per record.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from runtime.config import CheckpointingMode
from runtime.graph import JobGraph, JobVertex
from runtime.network import inflight
from runtime.network.debloat import REMOTE_CEILING_FACTOR, Debloater
from runtime.network.input_channel import InputChannel
from runtime.network.outputs import LocalOutput, RemoteOutput
from runtime.network.router import EdgeOutput, Router
from runtime.network.server import ChannelServer
from runtime.task.host import TaskHost
from runtime.task.operators import ChainedOutput, StreamOperator
from runtime.task.task import Task
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.job import StateJob
from statelog.state.backend import KeyedStateBackend

log = logging.getLogger(__name__)

# a vertex's input channels and the operator input (0 or 1) each one feeds
Inputs = dict[int, tuple[list[InputChannel], list[int]]]


class DeployHost(TaskHost, Protocol):
    """What deploying needs from the worker process (:class:`runtime.worker.process.Worker`)."""

    index: int  # the subtask this worker runs of every vertex
    secret: bytes  # the job secret channels authenticate with (runtime.network.auth)
    run_id: str
    attempt: int
    job: StateJob
    restore_meta: CheckpointMetadata | None
    server: ChannelServer
    wake: threading.Event  # set when a channel has something for the task thread

    def channel_error(self, message: str) -> None:
        """A channel to or from a peer broke."""
        ...


class SubtaskContext:
    """The :class:`~runtime.task.operators.OperatorContext` of one subtask: its keyed backends
    and their checkpoints (statelog's changelog, or the job's snapshot strategy)."""

    def __init__(self, host: DeployHost, subtask: int) -> None:
        self.host = host
        self.subtask = subtask
        self.parallelism = host.config.parallelism
        self.max_parallelism = host.config.max_parallelism
        self.run_id = host.run_id
        self.attempt = host.attempt

    def keyed_backend(self, uid: str) -> KeyedStateBackend:
        h = self.host
        return h.job.backend(
            uid, subtask=self.subtask, parallelism=self.parallelism,
            restore=h.restore_meta if h.restore_meta is not None else "none",  # the master chose
            changelog=h.config.snapshot_strategy is None,
        )  # fmt: skip

    def snapshot_backend(self, backend: KeyedStateBackend, checkpoint_id: int) -> Any:
        """The synchronous part of a keyed backend's checkpoint (a pending snapshot)."""
        strategy = self.host.config.snapshot_strategy
        if strategy is None:
            return backend.snapshot(checkpoint_id)
        return strategy.snapshot(backend, checkpoint_id, self.host.job.store)

    def backend_checkpoint_completed(self, backend: KeyedStateBackend, checkpoint_id: int) -> None:
        strategy = self.host.config.snapshot_strategy
        if strategy is None:
            backend.checkpoint_completed(checkpoint_id)
        else:
            try:
                strategy.checkpoint_completed(backend, checkpoint_id, self.host.job.store)
            except Exception as e:  # noqa: BLE001 - what older checkpoints of the strategy wrote
                log.warning("%s: could not clean up before checkpoint %d: %s", strategy.name, checkpoint_id, e)


def open_inputs(host: DeployHost, graph: JobGraph) -> Inputs:
    """Create the input channels of every local task and register them with the channel
    server; returns, per vertex id, its channels and the operator input each feeds."""
    p, i = host.config.parallelism, host.index
    cfg = host.config
    capacity = cfg.channel_capacity
    target = cfg.buffer_debloat_target
    inputs: Inputs = {}
    for v in graph.vertices:
        chans, idxs = [], []
        for edge, src in graph.input_channels(v, i, p):
            ceiling = capacity if src == i else REMOTE_CEILING_FACTOR * capacity  # in-process or remote
            debloater = Debloater(target, ceiling, cfg.batch_size) if target is not None else None
            ch = InputChannel(len(chans), capacity, host.wake, debloater, label=f"{edge.id}.{src}-{i}")
            chans.append(ch)
            idxs.append(edge.input_index)
            host.server.channels[(edge.id, src, i)] = ch
        inputs[v.id] = (chans, idxs)
    host.server.ready.set()
    return inputs


def build_router(
    host: DeployHost,
    v: JobVertex,
    local_inputs: dict[tuple[int, int], InputChannel],
    peers: list[tuple[str, int]],
) -> Router:
    """The outputs of vertex ``v``'s subtask: per edge, one channel per target subtask."""
    cfg = host.config
    p, i = cfg.parallelism, host.index
    capacity = cfg.channel_capacity
    debloat = None
    if cfg.buffer_debloat_target is not None:  # until the receiver reports, its ceiling
        ceiling = REMOTE_CEILING_FACTOR * capacity
        debloat = (ceiling, ceiling * cfg.batch_size)
    edges = []
    for e in v.outputs:
        outs: list[Any] = []
        dsts = [i] if e.partition == "forward" else list(range(p))
        for dst in dsts:
            if dst == i:
                outs.append(LocalOutput(local_inputs[(e.id, i)]))
            else:
                outs.append(RemoteOutput(
                    tuple(peers[dst]), (e.id, i, dst), host.channel_error, host.wake, capacity, debloat,
                    secret=host.secret,
                ))  # fmt: skip
        edges.append(EdgeOutput(e.partition, e.key_selector, outs, cfg.max_parallelism, cfg.batch_size))
    return Router(edges, capacity)


def build_chain(host: DeployHost, graph: JobGraph, v: JobVertex, router: Router) -> list[StreamOperator]:
    """The operators of vertex ``v``'s chain (without its source), set up in chain order."""
    ctx = SubtaskContext(host, host.index)
    ops: list[StreamOperator] = []
    for nid in v.chain:
        node = graph.stream.nodes[nid]
        if node.source is not None:
            continue
        if node.sink is not None:
            assert node.uid is not None
            ops.append(node.sink.create_operator(node.uid))
        else:
            assert node.operator is not None
            ops.append(node.operator)
    for k, op in enumerate(ops):
        op.setup(ctx, ChainedOutput(ops[k + 1]) if k + 1 < len(ops) else router)
    return ops


def build_tasks(
    host: DeployHost,
    graph: JobGraph,
    peers: list[tuple[str, int]],
    assignments: dict[int, dict[str, Any]],
) -> list[Task]:
    """Subtask ``host.index`` of every vertex, wired and set up (not opened yet).

    ``peers``: every worker's channel server address; ``assignments``: per source node id,
    this subtask's splits and their restored positions (``None``: from the start)."""
    cfg = host.config
    p, i = cfg.parallelism, host.index
    # input channels of every local task first: local outputs write into them
    inputs = open_inputs(host, graph)
    local_inputs = {(e.id, src): ch for v in graph.vertices for (e, src), ch in zip(
        graph.input_channels(v, i, p), inputs[v.id][0], strict=True)}  # fmt: skip
    aligned = cfg.mode == CheckpointingMode.EXACTLY_ONCE_ALIGNED
    unaligned = cfg.mode == CheckpointingMode.EXACTLY_ONCE_UNALIGNED
    tasks = []
    for v in graph.vertices:
        router = build_router(host, v, local_inputs, peers)
        ops = build_chain(host, graph, v, router)
        key = f"{v.id}.{i}"
        if v.source is not None:
            node = graph.stream.nodes[v.source]
            assert node.source is not None
            restored = host.restore_meta is not None and node.uid in host.restore_meta.sources
            splits = node.source.open_splits(assignments.get(node.id, {}), node.watermarks,
                                             subtask=i, parallelism=p, restored=restored)  # fmt: skip
            task = Task(host, key, v.id, ops, router, source=splits, source_uid=node.uid, aligned=aligned,
                        unaligned=unaligned, batch_rows=node.batch_rows)  # fmt: skip
        else:
            chans, idxs = inputs[v.id]
            chan_edges = [e.id for e, _src in graph.input_channels(v, i, p)]
            task = Task(host, key, v.id, ops, router, channels=chans, channel_inputs=idxs, aligned=aligned,
                        unaligned=unaligned, channel_edges=chan_edges)  # fmt: skip
        if host.restore_meta is not None:
            # in-flight data of an unaligned checkpoint (whatever this run's mode; a source
            # task has output only: what its barrier overtook)
            data_in, data_out = inflight.replay_for(
                host.job.store, host.restore_meta.sources, v.id, i, p, cfg.max_parallelism,
                {e.id: e for e in v.inputs},
            )
            if data_in or data_out:
                task.replay = (data_in, data_out)
        tasks.append(task)
    return tasks
