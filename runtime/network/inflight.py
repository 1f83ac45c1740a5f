"""In-flight data (channel state) of unaligned checkpoints: objects under the job root.

In ``exactly_once_unaligned`` mode a task snapshots at the *first* barrier ``n`` it sees
and forwards it at once; the records that barrier overtook are part of checkpoint ``n``:

* **input**: records that arrive on the task's other channels before their barrier ``n``
  (they are processed, but after the snapshot, and the sources resume after them), and the
  frames queued in a channel when its urgent barrier overtook them;
* **output**: records the task had emitted before the snapshot that were still in its
  output buffers or its remote outputs' queues (the barrier goes out ahead of them; a
  source task's object has output only).

The task writes them as one object per task and checkpoint, **before it acknowledges**:

``runtime/inflight/chk-<n>/<vertex>.<subtask>.bin`` =
``MAGIC (b"SLIF") | version (1 byte) | sha256(payload) (32 bytes) | payload``, where the
payload is a pickle of ``{"version", "checkpoint", "task", "vertex", "subtask",
"parallelism", "input": [(edge_id, input_index, value, ts)], "output": [(edge_index,
value, ts)]}``.

The acknowledgement references the object in its ``sources`` under the reserved key
:data:`INFLIGHT_KEY` (``{task: {"key", "bytes", "sha256", "version", "input", "output"}}``),
which the coordinator merges into the published checkpoint's ``sources`` (statelog's
metadata format is unchanged). A restore reads and verifies the objects of the restored
checkpoint and feeds them to the tasks before any new input (:func:`replay_for`).

Only the job root's ``runtime/`` prefix is used: the materializer's garbage collector
deletes only under ``changelog/`` and ``materializations/``. The job master deletes the
in-flight objects of checkpoints that are neither retained nor referenced by a savepoint
(:func:`collect_inflight`).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from materializer.savepoint import list_savepoints
from runtime.errors import RuntimeJobError
from runtime.network.batch_router import ColumnKey, split_by_key_group
from statelog.keys.groups import key_group_of, subtask_for_key_group
from statelog.layout import INFLIGHT_PREFIX, parse_inflight_key

log = logging.getLogger(__name__)

INFLIGHT_KEY = "__runtime.inflight__"
MAGIC = b"SLIF"
VERSION = 1


def too_large(size: int, cap: int, where: str) -> str:
    """The reason a checkpoint whose in-flight data exceeds ``max_inflight_bytes`` fails."""
    return (
        f"in-flight data of {size} bytes {where} exceeds max_inflight_bytes={cap}: lower "
        "buffer_debloat_target (less data buffered per channel), raise max_inflight_bytes, or use "
        "mode='exactly_once_aligned'"
    )


def encode(payload: dict[str, Any]) -> tuple[bytes, str]:
    """The object bytes and the payload's sha256 (hex)."""
    body = pickle.dumps(payload, protocol=5)
    digest = hashlib.sha256(body).digest()
    return MAGIC + bytes([VERSION]) + digest + body, digest.hex()


def decode(data: bytes, key: str, expected_sha256: str | None = None) -> dict[str, Any]:
    if data[:4] != MAGIC:
        raise RuntimeJobError(f"in-flight data {key}: not an in-flight object (bad magic)")
    if data[4] != VERSION:
        raise RuntimeJobError(f"in-flight data {key}: unsupported version {data[4]} (this runtime reads {VERSION})")
    digest, body = data[5:37], data[37:]
    if hashlib.sha256(body).digest() != digest or (expected_sha256 is not None and digest.hex() != expected_sha256):
        raise RuntimeJobError(f"in-flight data {key}: checksum mismatch (corrupt or replaced object)")
    payload: dict[str, Any] = pickle.loads(body)
    return payload


def references(sources: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The in-flight objects a checkpoint's ``sources`` reference, by task."""
    refs = (sources or {}).get(INFLIGHT_KEY) or {}
    return dict(refs)


def read_all(store: Any, sources: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Every in-flight payload of a checkpoint, by task, verified."""
    out = {}
    for task, ref in sorted(references(sources).items()):
        if ref.get("version") != VERSION:
            raise RuntimeJobError(f"in-flight data of task {task}: unsupported version {ref.get('version')!r}")
        out[task] = decode(store.get(ref["key"]), ref["key"], ref.get("sha256"))
    return out


def replay_for(
    store: Any,
    sources: dict[str, Any] | None,
    vertex_id: int,
    subtask: int,
    parallelism: int,
    max_parallelism: int,
    edges: dict[int, Any],
) -> tuple[list[tuple[int, int, Any, Any]], list[tuple[int, Any, Any]]]:
    """The in-flight input and output records task ``vertex_id.subtask`` must replay.

    At the checkpoint's parallelism a task takes its own object. At another parallelism the
    input records of every subtask of the vertex are redistributed: records of a ``hash``
    edge go to the subtask owning their key group (a record batch of an edge keyed by a
    column: the rows it owns), those of a ``forward`` edge (and output
    records) to ``old subtask % parallelism``.
    """
    refs = {t: r for t, r in references(sources).items() if int(t.split(".")[0]) == vertex_id}
    if not refs:
        return [], []
    inputs: list[tuple[int, int, Any, Any]] = []
    outputs: list[tuple[int, Any, Any]] = []
    for task, ref in sorted(refs.items(), key=lambda kv: int(kv[0].split(".")[1])):
        old_sub = int(task.split(".")[1])
        old_p = int(ref.get("parallelism", parallelism))
        if old_p == parallelism and old_sub != subtask:
            continue
        if ref.get("version") != VERSION:
            raise RuntimeJobError(f"in-flight data of task {task}: unsupported version {ref.get('version')!r}")
        payload = decode(store.get(ref["key"]), ref["key"], ref.get("sha256"))
        if old_p == parallelism:
            inputs.extend(payload["input"])
            outputs.extend(payload["output"])
            continue
        if old_sub % parallelism == subtask:
            outputs.extend(payload["output"])
        for rec in payload["input"]:
            edge = edges.get(rec[0])
            if edge is None:
                raise RuntimeJobError(f"in-flight data of task {task}: unknown input edge {rec[0]}")
            if edge.key_selector is None:
                if old_sub % parallelism == subtask:
                    inputs.append(rec)
            elif isinstance(edge.key_selector, ColumnKey) and isinstance(rec[2], pa.RecordBatch):
                part = split_by_key_group(rec[2], edge.key_selector.name, max_parallelism, parallelism)[subtask]
                if part is not None:  # the rows of a batch this subtask owns now
                    inputs.append((rec[0], rec[1], part, rec[3]))
            else:
                kg = key_group_of(edge.key_selector(rec[2]), max_parallelism)
                if subtask_for_key_group(max_parallelism, parallelism, kg) == subtask:
                    inputs.append(rec)
    return inputs, outputs


def _checkpoint_dirs(store: Any) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for info in store.list(INFLIGHT_PREFIX):
        parsed = parse_inflight_key(info.key)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(info.key)
    return out


class _KeepAll(Exception):
    pass


def _savepoint_ids(store: Any) -> set[int]:
    ids = set()
    for sp in list_savepoints(store):
        if "error" in sp:  # an unreadable savepoint may reference anything: keep everything
            raise _KeepAll
        refs = references(sp.get("sources"))
        for ref in refs.values():
            parsed = parse_inflight_key(str(ref.get("key", "")))
            if parsed is not None:
                ids.add(parsed[0])
    return ids


def collect_inflight(store: Any, retained: Iterable[int], newest_completed: int) -> list[int]:
    """Delete the in-flight objects of checkpoints up to ``newest_completed`` that are neither
    retained nor referenced by a savepoint; returns the checkpoint ids cleaned. Newer ids
    belong to checkpoints in flight and are kept."""
    dirs = _checkpoint_dirs(store)
    keep = set(retained)
    doomed = [cid for cid in dirs if cid <= newest_completed and cid not in keep]
    if not doomed:
        return []
    try:
        keep |= _savepoint_ids(store)
    except _KeepAll:
        return []
    cleaned = []
    for cid in sorted(doomed):
        if cid in keep:
            continue
        for key in dirs[cid]:
            store.delete(key)
        cleaned.append(cid)
    if cleaned:
        log.debug("deleted the in-flight data of checkpoints %s", cleaned)
    return cleaned
