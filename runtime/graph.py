"""The stream graph (what the API builds) and the job graph (what workers run).

**Stream graph**: one :class:`StreamNode` per source, operator or sink; each input of a
node is an :class:`InputEdge` naming the upstream node, its partitioning (``forward``: subtask
``i`` to subtask ``i``; ``hash``: by key group of ``key_selector(value)``) and the input index
(0, or 1 for the second input of ``connect``). ``union`` and ``key_by`` are not nodes: they
only shape the inputs of the consuming node.

**Job graph**: nodes are chained into **vertices** (one task per subtask): a node joins its
upstream's chain when it has exactly one input, that input is ``forward`` and the upstream
has no other consumer. Every vertex runs at the job's parallelism; worker ``i`` runs subtask
``i`` of every vertex (Flink's slot sharing). A **channel** connects one upstream subtask to
one downstream subtask of an edge between vertices: ``forward`` edges have ``p`` channels,
``hash`` edges ``p * p``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.connectors.sinks import Sink
from runtime.connectors.sources import Source, WatermarkStrategy
from runtime.errors import JobGraphError
from runtime.task.operators import StreamOperator

FORWARD = "forward"
HASH = "hash"


@dataclass(frozen=True)
class InputEdge:
    node: int
    partition: str  # FORWARD or HASH
    key_selector: Callable[[Any], Any] | None
    input_index: int = 0


@dataclass
class StreamNode:
    id: int
    name: str
    uid: str | None
    inputs: list[InputEdge]
    operator: StreamOperator | None = None
    source: Source | None = None
    watermarks: WatermarkStrategy | None = None
    sink: Sink | None = None
    batch_rows: int | None = None  # a source read as Arrow record batches of up to this many rows

    @property
    def kind(self) -> str:
        return "source" if self.source is not None else "sink" if self.sink is not None else "operator"

    @property
    def stateful(self) -> bool:
        return self.operator is not None and self.operator.stateful


@dataclass
class StreamGraph:
    nodes: list[StreamNode] = field(default_factory=list)

    def add(self, **kw: Any) -> StreamNode:
        node = StreamNode(id=len(self.nodes), **kw)
        self.nodes.append(node)
        return node

    def consumers(self, node_id: int) -> list[StreamNode]:
        return [n for n in self.nodes if any(e.node == node_id for e in n.inputs)]

    def stateful_uids(self) -> set[str]:
        return {n.uid for n in self.nodes if n.stateful and n.uid}

    def source_uids(self) -> set[str]:
        return {n.uid for n in self.nodes if n.source is not None and n.uid}

    def sinks(self) -> list[StreamNode]:
        return [n for n in self.nodes if n.sink is not None]

    def validate(self) -> None:
        if not any(n.source is not None for n in self.nodes):
            raise JobGraphError("the job has no source; add one with env.from_source(...)")
        if not self.sinks():
            raise JobGraphError("the job has no sink; end every pipeline with .sink_to(sink, uid=...)")
        seen: dict[str, StreamNode] = {}
        for n in self.nodes:
            needs_uid = n.stateful or n.source is not None or n.sink is not None
            if needs_uid and not n.uid:
                raise JobGraphError(
                    f"{n.kind} {n.name!r} needs a uid: state and positions are matched by uid on restore"
                )
            if n.uid:
                if n.uid in seen:
                    raise JobGraphError(f"uid {n.uid!r} is used by {seen[n.uid].name!r} and {n.name!r}; uids must be unique")
                seen[n.uid] = n


@dataclass(frozen=True)
class JobEdge:
    id: int
    src: int  # vertex id
    dst: int
    partition: str
    key_selector: Callable[[Any], Any] | None
    input_index: int


@dataclass
class JobVertex:
    id: int
    chain: list[int]  # stream node ids, head first
    name: str
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)
    source: int | None = None  # the source node heading the chain, if any

    @property
    def head(self) -> int:
        return self.chain[0]


@dataclass
class JobGraph:
    stream: StreamGraph
    vertices: list[JobVertex]
    edges: list[JobEdge]

    @staticmethod
    def build(stream: StreamGraph) -> JobGraph:
        stream.validate()
        vertex_of: dict[int, int] = {}
        vertices: list[JobVertex] = []
        for n in stream.nodes:  # nodes are created in topological order
            chained_to = None
            if len(n.inputs) == 1 and n.inputs[0].partition == FORWARD:
                up = n.inputs[0].node
                if len(stream.consumers(up)) == 1 and stream.nodes[up].sink is None:
                    chained_to = vertex_of[up]
            if chained_to is not None:
                v = vertices[chained_to]
                v.chain.append(n.id)
                v.name = f"{v.name} -> {n.name}"
                vertex_of[n.id] = v.id
            else:
                v = JobVertex(id=len(vertices), chain=[n.id], name=n.name)
                if n.source is not None:
                    v.source = n.id
                vertices.append(v)
                vertex_of[n.id] = v.id
        edges: list[JobEdge] = []
        for n in stream.nodes:
            if vertices[vertex_of[n.id]].head == n.id:
                for e in n.inputs:
                    je = JobEdge(len(edges), vertex_of[e.node], vertex_of[n.id], e.partition, e.key_selector, e.input_index)
                    edges.append(je)
                    vertices[je.src].outputs.append(je)
                    vertices[je.dst].inputs.append(je)
        for v in vertices:
            for nid in v.chain[:-1]:
                if len(stream.consumers(nid)) != 1:
                    raise JobGraphError(f"internal: node {nid} has several consumers inside a chain")
        return JobGraph(stream, vertices, edges)

    def input_channels(self, vertex: JobVertex, subtask: int, parallelism: int) -> list[tuple[JobEdge, int]]:
        """The input channels of one task as ``(edge, upstream subtask)``, in gate order."""
        out = []
        for e in vertex.inputs:
            if e.partition == FORWARD:
                out.append((e, subtask))
            else:
                out.extend((e, i) for i in range(parallelism))
        return out

    def describe(self) -> str:
        lines = []
        for v in self.vertices:
            ins = ", ".join(f"{e.partition} from v{e.src}#{e.input_index}" for e in v.inputs) or "-"
            lines.append(f"v{v.id} [{v.name}] inputs: {ins}")
        return "\n".join(lines)
