"""A task whose keyed head keeps its state on disk reads each input frame's keys in one batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

import statelog
from runtime.api.functions import KeyedProcessFunction, ProcessContext
from runtime.task.operators import KeyedProcessOperator
from runtime.task.task import Task
from statelog import ValueStateDescriptor

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


class _Count(KeyedProcessFunction):
    def open(self, ctx: ProcessContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process_element(self, value: Any, ctx: ProcessContext) -> Any:
        self.count.update(self.count.value() + 1)
        return [(value["k"], self.count.value())]


class _Out:
    def __init__(self) -> None:
        self.out: list[Any] = []

    def emit(self, value: Any, ts: Any) -> None:
        self.out.append(value)


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_keyed_head_on_disk_prefetches_each_frame_and_outputs_the_same(tmp_path, store: str) -> None:
    job = statelog.open((tmp_path / "r").as_uri(), state_store=store, state_dir=str(tmp_path / "ws"))
    job.state_cache_entries = 64  # far fewer than the keys: most records miss
    backend = job.backend("count")
    ctx = SimpleNamespace(keyed_backend=lambda uid: backend, subtask=0, parallelism=1)
    op = KeyedProcessOperator("count", _Count(), (lambda v: v["k"],))
    out = _Out()
    op.setup(ctx, out)  # type: ignore[arg-type]
    task = Task(SimpleNamespace(batch_size=256), "1.0", 1, [op], out, channels=[None], channel_inputs=[0])  # type: ignore[arg-type]
    task.open()
    frames = [[({"k": (i * 7 + j * 13) % 500}, None) for j in range(100)] for i in range(60)]
    frames[3].append(({"no key": 1}, None))  # its selector fails: process() raises for it, not prefetch
    for i, frame in enumerate(frames):
        if i == 3:
            with pytest.raises(KeyError):
                task._process_frame(0, (frame, None))
        else:
            task._process_frame(0, (frame, None))
    seen: dict[int, int] = {}
    want = []
    for frame in frames:
        for v, _ts in frame:
            if "k" in v:
                seen[v["k"]] = seen.get(v["k"], 0) + 1
                want.append((v["k"], seen[v["k"]]))
    assert out.out == want
    ws = backend._ws
    if store == "disk":
        assert task._prefetch is not None and ws.prefetched > 1000, ws.stats()
    else:
        assert task._prefetch is None and ws is None
    job.close()
