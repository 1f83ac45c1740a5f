"""State dumps: the whole keyed state of a backend written as one object.

A state dump is what a checkpoint costs without a changelog (Flink's full snapshots of the
heap backend); the benchmarks and the runtime's ``state-dump`` baseline
(:mod:`bench.baselines.state_dump_backend`) compare it with changelog checkpoints on the same state.
It is neither a checkpoint's seal (``KeyedStateBackend.snapshot``) nor a materialization.
Format ``statelog.state-dump`` v1 (``docs/format.md``): for each
registered state, a ``u64`` length followed by an Arrow IPC stream (zstd body compression)
holding one record batch with columns ``key_group``, ``key``, ``namespace``, ``value`` and
the state name in the schema metadata (``value`` is Arrow-typed for value-like states with
Arrow types and pickled ``binary`` for list, map and pickled states), rows ordered by key
group; then a 12-byte trailer ``u32 CRC-32 of everything before | 8s b"STLGFUL1"``. Timers
and TTL expiries are not included: it is a benchmark baseline, not a restore format.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from statelog.descriptors import StateKind
from statelog.errors import CorruptionError, StatelogError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import key_group_of_bytes
from statelog.state.backend import KeyedStateBackend
from statelog.state.keyed import _MISSING
from statelog.store.base import ObjectStore
from statelog.types import PICKLE, arrow_type, to_arrow

MAGIC = b"STLGFUL1"
_TRAILER = struct.Struct(">I8s")


class CapturedState:
    """The synchronous part of a state dump: shallow copies of every state's tables.

    Taking it costs one ``dict.copy()`` per namespace table (plus a copy of each list or map
    value, which the task may mutate in place); :func:`encode_captured` then serializes it
    off the task thread while the task goes on changing the live tables (copy-on-capture,
    the role of the copy-on-write tables of Flink's heap backend).
    """

    def __init__(self, backend: KeyedStateBackend) -> None:
        if backend._ws is not None:
            raise StatelogError(
                "a state dump copies the in-memory tables; a backend with state_store='disk' keeps its "
                "state on local disk: dump a backend opened with state_store='memory'"
            )
        self.max_parallelism = backend.max_parallelism
        self.kcache = backend._kcache
        self.now = backend.clock()
        self.states: list[tuple[str, Any, list[tuple[bytes, dict[Any, Any]]]]] = []
        for name in backend.state_names():
            state = backend._states[name]
            mutable = state.info.kind in (StateKind.LIST, StateKind.MAP)
            tables = []
            for nsb, table in state._tables.items():
                if not table:
                    continue
                if mutable:
                    copy = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                            for k, v in table.items()}
                else:
                    copy = table.copy()
                tables.append((nsb, copy))  # namespace tables are keyed by the encoded namespace
            self.states.append((name, state, tables))


def encode_state_dump(backend: KeyedStateBackend) -> bytes:
    return encode_captured(CapturedState(backend))


def encode_captured(captured: CapturedState) -> bytes:
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
    cache = captured.kcache
    maxp = captured.max_parallelism
    now = captured.now
    for name, state, tables in captured.states:
        info = state.info
        kbs: list[bytes] = []
        kgs: list[int] = []
        nss: list[bytes] = []
        values: list[Any] = []
        visible = state._visible
        for nsb, table in tables:
            for key, entry in table.items():
                value = visible(entry, now)
                if value is _MISSING:
                    continue
                hit = cache.get(key)
                if hit is not None and hit[0] is type(key):
                    kb, kg = hit[1], hit[2]
                else:
                    kb = encode_key(key)
                    kg = key_group_of_bytes(kb, maxp)
                kbs.append(kb)
                kgs.append(kg)
                nss.append(nsb)
                values.append(value)
        if info.kind in (StateKind.LIST, StateKind.MAP) or info.value_type is PICKLE:
            value_arr = pa.array([pickle.dumps(v, protocol=5) for v in values], pa.binary())
        else:
            value_arr = to_arrow(values, info.value_type)
        batch_schema = pa.schema(
            [
                pa.field("key_group", pa.uint16()),
                pa.field("key", pa.binary()),
                pa.field("namespace", pa.binary()),
                pa.field("value", value_arr.type if len(values) else arrow_type(info.value_type)),
            ],
            metadata={b"statelog.state": name.encode()},
        )
        batch = pa.record_batch(
            [pa.array(kgs, pa.uint16()), pa.array(kbs, pa.binary()), pa.array(nss, pa.binary()), value_arr],
            schema=batch_schema,
        )
        # entries partitioned by key group (a stable sort), as Flink's heap backend writes its
        # full snapshots (KeyGroupPartitioner): restorable and rescalable by key group
        batch = batch.take(pc.sort_indices(batch.column(0)))
        # one IPC stream per state, concatenated with length prefixes
        part = pa.BufferOutputStream()
        with pa.ipc.new_stream(part, batch_schema, options=opts) as w:
            w.write_batch(batch)
        data = part.getvalue().to_pybytes()
        sink.write(struct.pack(">Q", len(data)))
        sink.write(data)
    body = sink.getvalue().to_pybytes()
    return body + _TRAILER.pack(zlib.crc32(body), MAGIC)


def decode_state_dump(data: bytes, object_key: str) -> dict[str, pa.Table]:
    if len(data) < _TRAILER.size:
        raise CorruptionError(f"state dump {object_key} is truncated", key=object_key)
    crc, magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    body = data[: -_TRAILER.size]
    if magic != MAGIC or zlib.crc32(body) != crc:
        raise CorruptionError(f"state dump {object_key}: checksum mismatch or bad magic", key=object_key)
    out: dict[str, pa.Table] = {}
    pos = 0
    while pos < len(body):
        (n,) = struct.unpack_from(">Q", body, pos)
        pos += 8
        table = pa.ipc.open_stream(pa.py_buffer(body[pos : pos + n])).read_all()
        pos += n
        out[table.schema.metadata[b"statelog.state"].decode()] = table
    return out


def write_state_dump(backend: KeyedStateBackend, store: ObjectStore, key: str) -> int:
    """Serialize every state of ``backend`` and store it under ``key``; returns the bytes written."""
    data = encode_state_dump(backend)
    store.put(key, data)
    return len(data)
