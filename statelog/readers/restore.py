"""Restoring one state of one operator for a key-group range, as a runtime restore does.

The data source and the tools restore through the library: the checkpoint's handles that
overlap the range, their materialized parts (only the state's table files, only the
overlapping row groups) and their changelog ranges of that state, read with
:func:`statelog.restore.eager.read_changes` and replayed by a
:class:`~statelog.state.backend.KeyedStateBackend` without changelog. Only the requested state is
read: each changelog range holds the records of one state (its stream id ends with
``/<state name>``, docs/format.md 4.7) and each table file holds one state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from statelog.changelog.format import TIMER_STATES
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.metadata import CheckpointMetadata, OperatorState
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateInfo,
    StateKind,
    ValueStateDescriptor,
)
from statelog.errors import StatelogError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import KeyGroupRange, key_group_range_for_subtask
from statelog.materialization.manifest import Manifest, load_manifest
from statelog.restore.changes import RestoredChanges
from statelog.restore.eager import read_changes
from statelog.state.backend import KeyedStateBackend
from statelog.store.base import ObjectStore

# The clock of restoring backends: far in the past, so that no entry is hidden as expired.
# Rows carry each entry's TTL expiry instead (``expires_ms``), see docs/spark.md.
FAR_PAST_MS = -(1 << 62)


def stream_state(stream_id: str) -> str:
    """The state name of a changelog stream id ``<operator>.<subtask>.<hex>/<state>``."""
    return stream_id.rsplit("/", 1)[-1]


def _never(*_args: Any) -> Any:
    raise StatelogError("statelog.spark restores state read-only; a reduce or aggregate function never runs")


class _ReadOnlyAggregate:
    create_accumulator = add = get_result = staticmethod(_never)


def descriptor_of(info: StateInfo) -> StateDescriptor:
    """A descriptor that takes over the stored state (reducing and aggregating state replay
    stored values; their functions are never called)."""
    if info.kind is StateKind.LIST:
        return ListStateDescriptor(info.name, info.value_type, info.ttl)
    if info.kind is StateKind.MAP:
        assert info.user_key_type is not None
        return MapStateDescriptor(info.name, info.value_type, info.ttl, key_type=info.user_key_type)
    if info.kind is StateKind.REDUCING:
        return ReducingStateDescriptor(info.name, info.value_type, info.ttl, reduce_fn=_never)
    if info.kind is StateKind.AGGREGATING:
        return AggregatingStateDescriptor(info.name, info.value_type, info.ttl, aggregate=_ReadOnlyAggregate())
    return ValueStateDescriptor(info.name, info.value_type, info.ttl)


def _only_state(m: Manifest, name: str) -> Manifest:
    ops = {uid: dataclasses.replace(mop, files={n: fs for n, fs in mop.files.items() if n == name})
           for uid, mop in m.operators.items()}
    return dataclasses.replace(m, operators=ops)


def read_state_changes(
    store: ObjectStore, op: OperatorState, name: str, kgr: KeyGroupRange,
    manifests: dict[str, Manifest] | None = None,
) -> RestoredChanges:
    """What a restore of key groups ``kgr`` reads for state ``name`` (and nothing else)."""
    handles = []
    cache: dict[str, Manifest] = {}
    full = manifests if manifests is not None else {}
    for h in op.handles_for(kgr):
        handles.append(dataclasses.replace(h, changelog=tuple(r for r in h.changelog if stream_state(r.stream) == name)))
        for p in h.materialization:
            if p.manifest not in cache:
                cache[p.manifest] = _only_state(load_manifest(store, p, full), name)
    return read_changes(SegmentReader(store), handles, kgr, cache)


def restored_backend(
    store: ObjectStore, meta: CheckpointMetadata, op: OperatorState, name: str, index: int, count: int,
    manifests: dict[str, Manifest] | None = None,
) -> KeyedStateBackend:
    """A backend without changelog holding state ``name`` of subtask ``index`` of ``count``."""
    kgr = key_group_range_for_subtask(meta.max_parallelism, count, index)
    restored = read_state_changes(store, op, name, kgr, manifests)
    return KeyedStateBackend(
        operator_uid=op.uid,
        subtask=index,
        parallelism=count,
        max_parallelism=meta.max_parallelism,
        writer=None,
        clock=lambda: FAR_PAST_MS,
        restored=restored,
    )


def namespace_tables(backend: KeyedStateBackend, info: StateInfo) -> Iterator[tuple[bytes, Any, dict[Any, Any]]]:
    """``(namespace bytes, namespace, {key: stored entry})`` of every non-empty namespace of a state.

    The state is registered first (which replays it). Stored entries are the values for
    states without TTL (list: a list, map: a dict); with TTL ``[value, expiry]`` (list:
    per element, map: per map value). Every entry is included, expired or not (the
    backend's clock is far in the past and nothing was read). This walks the state's
    tables directly: ``backend.entries()`` yields the same entries one by one but hides
    the expiry (see docs/spark.md, "TTL").
    """
    state = backend.get_state(descriptor_of(info))
    for nsb, table in state._tables.items():
        if table:
            yield nsb, state._namespaces[nsb], table


def split_entries(info: StateInfo, entries: list[Any]) -> tuple[list[Any], list[Any] | None]:
    """Stored entries of :func:`namespace_tables` as (values, expiries); expiries ``None``
    without TTL, else per entry an int (value-like), a list (list) or a dict (map)."""
    if info.ttl is None:
        return entries, None
    if info.kind is StateKind.LIST:
        return [[x[0] for x in e] for e in entries], [[x[1] for x in e] for e in entries]
    if info.kind is StateKind.MAP:
        return [{k: x[0] for k, x in e.items()} for e in entries], [{k: x[1] for k, x in e.items()} for e in entries]
    return [e[0] for e in entries], [e[1] for e in entries]


Entry = tuple[Any, Any, bytes, Any, Any]  # key, namespace, namespace bytes, value, expiry


def state_entries(backend: KeyedStateBackend, info: StateInfo) -> Iterator[Entry]:
    """``(key, namespace, namespace bytes, value, expiry)`` of every entry of a state (see
    :func:`namespace_tables`; ``expiry`` as in :func:`split_entries`, ``None`` without TTL)."""
    for nsb, ns, table in namespace_tables(backend, info):
        values, exps = split_entries(info, list(table.values()))
        for i, key in enumerate(table):
            yield key, ns, nsb, values[i], None if exps is None else exps[i]


def timer_entries(backend: KeyedStateBackend, name: str) -> Iterator[tuple[Any, Any, bytes, int]]:
    """``(key, namespace, namespace bytes, timestamp)`` of every timer of one domain."""
    domain = "event" if name == TIMER_STATES[0] else "processing"
    for t in backend.timers.timers(domain):
        yield t.key, t.namespace, encode_key(t.namespace), t.timestamp
