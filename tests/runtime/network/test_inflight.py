"""runtime.network.inflight: the in-flight record batches of an unaligned checkpoint,
restored at another parallelism, are split so every subtask replays the rows it owns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from runtime.graph import HASH, JobEdge
from runtime.network import inflight
from runtime.network.batch_router import ColumnKey
from statelog import layout
from statelog.keys.groups import key_group_of, subtask_for_key_group
from statelog.store import open_store


def test_inflight_batches_of_a_column_keyed_edge_are_split_by_key_group_at_another_parallelism(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/root")
    sources: dict[str, Any] = {"src": {"0": 1}}
    for sub in range(2):
        batch = pa.RecordBatch.from_pydict({"k": [f"k{i}" for i in range(sub, 60, 2)], "sub": [sub] * 30})
        payload = {"version": 1, "checkpoint": 3, "task": f"4.{sub}", "vertex": 4, "subtask": sub, "parallelism": 2,
                   "input": [(9, 0, batch, None)], "output": []}
        data, digest = inflight.encode(payload)
        key = layout.inflight_key(3, f"4.{sub}")
        store.put(key, data)
        sources.setdefault(inflight.INFLIGHT_KEY, {})[f"4.{sub}"] = {
            "key": key, "sha256": digest, "version": 1, "parallelism": 2}
    edges = {9: JobEdge(9, 1, 4, HASH, ColumnKey("k"), 0)}
    seen = []
    for new in range(3):
        data_in, _out = inflight.replay_for(store, sources, 4, new, 3, 128, edges)
        for edge, idx, part, ts in data_in:
            assert (edge, idx, ts) == (9, 0, None) and isinstance(part, pa.RecordBatch)
            keys = part.column("k").to_pylist()
            assert {subtask_for_key_group(128, 3, key_group_of(k, 128)) for k in keys} == {new}
            seen += keys
    assert sorted(seen) == sorted(f"k{i}" for i in range(60))
