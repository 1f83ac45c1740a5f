"""Modify state offline: read a checkpoint or savepoint with the readers, transform, write a new savepoint.

:func:`read_state` gives one state's rows in the view's shape (the rows ``statelog sql`` and
``format("statelog")`` show, with ``key_bytes`` and ``namespace_bytes``, so they go back
into a :class:`~statelog.state_processor.SavepointWriter` unchanged). :func:`rewrite` copies
every state of a checkpoint into a new savepoint, with the usual edits: drop states or
operators, rename operators, cast a value type explicitly, filter keys, add states; into the
same root or a new one with another ``max_parallelism`` (the one way to change it: a root's
``max_parallelism`` is fixed, key groups are recomputed from the keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.descriptors import StateInfo, StateKind
from statelog.errors import ConfigError
from statelog.job import StateJob
from statelog.readers import options as opt
from statelog.readers.restore import restored_backend
from statelog.readers.schema import Columns
from statelog.readers.state import state_batches, state_schema
from statelog.state_processor.convert import Where, cast_column
from statelog.state_processor.writer import SavepointWriter, StateData
from statelog.types import PICKLE, ValueType, arrow_type

KeyFilter = Callable[[pa.Table], pa.Array]  # the rows of a state table -> a boolean mask of the rows to keep


def states_of(meta: CheckpointMetadata) -> dict[str, dict[str, StateInfo]]:
    """The states of every operator of ``meta`` (user states, then the timers), by name."""
    out: dict[str, dict[str, StateInfo]] = {}
    for uid, op in sorted(meta.operators.items()):
        out[uid] = dict(op.states)
    return out


def read_state(job: StateJob, meta: CheckpointMetadata, operator: str, state: str,
               manifests: dict[str, Any] | None = None) -> pa.Table:
    """The view-shaped rows of one state at ``meta`` (``key_bytes``, ``namespace_bytes``, values)."""
    op = opt.operator_of(meta, operator, opt.describe(meta))
    info = opt.state_of(op, state, opt.describe(meta))
    columns = Columns(state_schema(info, None))
    backend = restored_backend(job.store, meta, op, state, 0, 1, manifests if manifests is not None else {})
    batches = list(state_batches(backend, info, None, meta.max_parallelism, columns))
    return pa.Table.from_batches(batches, schema=columns.arrow)


def cast_state(info: StateInfo, table: pa.Table, value_type: ValueType, operator: str = "?") -> tuple[StateInfo, pa.Table]:
    """``info`` with value type ``value_type`` and ``table``'s ``value`` cast to it (values that do
    not fit are refused naming the row). Lists cast their elements, maps their values."""
    if info.value_type is PICKLE or value_type is PICKLE:
        raise ConfigError(f"operator {operator!r}, state {info.name!r}: casts between pickled and Arrow types are not "
                          "supported; convert the value_pickle column yourself")
    where = Where(operator, info.name)
    new = StateInfo(info.name, info.kind, value_type, info.user_key_type, info.ttl)
    t = arrow_type(value_type)
    col = table.column("value")
    if info.kind is StateKind.LIST:
        target: pa.DataType = pa.list_(t)
    elif info.kind is StateKind.MAP:
        assert info.user_key_type is not None
        target = pa.map_(col.type.key_type, t)
    else:
        target = t
    i = table.schema.get_field_index("value")
    return new, table.set_column(i, "value", cast_column(col, target, where, "value"))


def rewrite(
    source: StateJob,
    checkpoint: str | int | CheckpointMetadata,
    writer: SavepointWriter,
    *,
    drop_operators: Sequence[str] = (),
    drop_states: Sequence[tuple[str, str]] = (),
    rename_operators: Mapping[str, str] | None = None,
    casts: Mapping[tuple[str, str], ValueType] | None = None,
    key_filter: KeyFilter | None = None,
    add: Mapping[tuple[str, str], tuple[StateInfo, StateData]] | None = None,
) -> CheckpointMetadata:
    """Copy the state of ``checkpoint`` of ``source`` into ``writer``'s savepoint, with edits; publish it.

    ``drop_states`` and ``casts`` name states by (operator uid in the source, state); ``add``
    by (operator uid in the savepoint, state). ``key_filter`` gets each state's view rows and
    returns a mask of the rows to keep (e.g. ``lambda t: pc.starts_with(t["key"], "user-")``).
    The savepoint keeps the source's checkpoint id and source positions unless the writer was
    given others.
    """
    meta = checkpoint if isinstance(checkpoint, CheckpointMetadata) else opt.resolve(source, str(checkpoint))
    where = opt.describe(meta)
    rename = dict(rename_operators or {})
    casts = dict(casts or {})
    for uid in [*drop_operators, *rename, *(u for u, _ in drop_states), *(u for u, _ in casts)]:
        opt.operator_of(meta, uid, where)
    for uid, name in [*drop_states, *casts]:
        opt.state_of(meta.operators[uid], name, where)
    kept = [u for u in sorted(meta.operators) if u not in set(drop_operators)]
    new_uids = [rename.get(u, u) for u in kept]
    if len(set(new_uids)) != len(new_uids):
        raise ConfigError(f"after renaming, operator uids {new_uids} are not unique; pick unique uids")
    if writer.checkpoint_id == 0:
        writer.checkpoint_id = meta.checkpoint_id
    if not writer.sources:
        writer.sources = dict(meta.sources)
    manifests: dict[str, Any] = {}
    for uid in kept:
        new_uid = rename.get(uid, uid)
        op = meta.operators[uid]
        for name, info in op.states.items():
            if (uid, name) in set(drop_states):
                continue
            table = read_state(source, meta, uid, name, manifests)
            if key_filter is not None and table.num_rows:
                table = table.filter(key_filter(table))
            if (uid, name) in casts:
                info, table = cast_state(info, table, casts[(uid, name)], uid)
            writer.add(new_uid, info if name not in TIMER_STATES else name, table, parallelism=op.parallelism)
    for (uid, _name), (info, data) in (add or {}).items():
        writer.add(uid, info, data)
    return writer.publish()
