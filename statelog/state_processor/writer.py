""":class:`SavepointWriter`: a savepoint from Arrow tables, in-process (pyarrow only)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from statelog.changelog.format import TIMER_STATES
from statelog.descriptors import StateDescriptor, StateInfo, StateKind, TtlConfig, check_state_name
from statelog.errors import ConfigError
from statelog.layout import check_savepoint_name
from statelog.materialization.manifest import TableFile
from statelog.materialization.table_schema import table_schema
from statelog.materialization.table_writer import MaterializeOptions
from statelog.state.timers import TIMER_INFOS
from statelog.state_processor import write
from statelog.state_processor.convert import Where, to_state_table
from statelog.state_processor.progress import InProgress
from statelog.store import open_store
from statelog.store.base import ObjectStore
from statelog.types import PICKLE, ValueType, check_value_type

log = logging.getLogger(__name__)

StateData = pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch]


def state_info(name: str, kind: str | StateKind, value_type: ValueType, user_key_type: ValueType | None = None,
               ttl_ms: int | None = None) -> StateInfo:
    """A state's description from its parts (``kind``: value, list, map, reducing, aggregating)."""
    kinds = [k.value for k in StateKind]
    try:
        k = StateKind(kind)
    except ValueError:
        raise ConfigError(f"state {name!r}: unknown state kind {kind!r}; expected one of {', '.join(kinds)}") from None
    check_state_name(name)
    check_value_type(value_type, f"state {name!r}")
    if k is StateKind.MAP:
        if user_key_type is None:
            raise ConfigError(f"map state {name!r} needs its map key type (user_key_type)")
        check_value_type(user_key_type, f"map state {name!r} (key type)")
    elif user_key_type is not None:
        raise ConfigError(f"{k.value} state {name!r} has no map key type; give user_key_type for map states only")
    return StateInfo(name, k, value_type, user_key_type, None if ttl_ms is None else TtlConfig(ttl_ms))


def as_info(state: StateDescriptor | StateInfo | str) -> StateInfo:
    """The description of ``state``: a descriptor, a :class:`StateInfo` or a timer pseudo-state's name."""
    if isinstance(state, StateInfo):
        return state
    if isinstance(state, StateDescriptor):
        return StateInfo.from_descriptor(state)
    if isinstance(state, str) and state in TIMER_STATES:
        return next(i for i in TIMER_INFOS if i.name == state)
    raise ConfigError(f"state {state!r}: give a state descriptor (statelog.ValueStateDescriptor, ...), a StateInfo "
                      f"(statelog.state_processor.state_info(...)) or a timer pseudo-state ({', '.join(TIMER_STATES)})")


def as_table(data: StateData) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    batches = list(data)
    if not batches:
        raise ConfigError("no record batches given (give an empty pa.Table for a state without rows)")
    return pa.Table.from_batches(batches)


class SavepointWriter:
    """Writes savepoint ``name`` of root ``root`` from view-shaped Arrow tables::

        w = SavepointWriter("file:///var/lib/clicks", "bootstrap", max_parallelism=128)
        w.add("counter", ValueStateDescriptor("count", pa.int64()), table)   # columns key, value
        meta = w.publish()                         # then restore="savepoint:bootstrap"

    :meth:`add` checks the rows against the state's description at once (nothing is written
    yet); :meth:`publish` writes the state tables, the manifest and, last, the savepoint
    metadata. A failed check or write publishes nothing. On a root without a job,
    ``max_parallelism`` is required and ``job.json`` is created at publish; on a root with a
    job it must be the job's (or omitted).
    """

    def __init__(self, root: str, name: str, *, max_parallelism: int | None = None, parallelism: int = 1,
                 sources: Mapping[str, Any] | None = None, checkpoint_id: int = 0,
                 store_options: Mapping[str, Any] | None = None, store: ObjectStore | None = None,
                 options: MaterializeOptions | None = None) -> None:
        self.name = check_savepoint_name(name)
        self._own_store = store is None
        self.store = store if store is not None else open_store(root, dict(store_options or {}) or None)
        try:
            self.job_id, self.max_parallelism = write.job_of_root(self.store, max_parallelism)
            write.check_name_free(self.store, self.name)
        except BaseException:
            self.close()
            raise
        self.parallelism = parallelism
        self.sources = dict(sources or {})
        self.checkpoint_id = checkpoint_id
        self.options = options or MaterializeOptions()
        self._tables: dict[str, dict[str, tuple[StateInfo, pa.Table]]] = {}
        self._parallelism: dict[str, int] = {}
        self.published = None

    def close(self) -> None:
        if self._own_store:
            self.store.close()

    def __enter__(self) -> SavepointWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, operator: str, state: StateDescriptor | StateInfo | str, data: StateData, *,
            parallelism: int | None = None) -> int:
        """Check the rows of one state of ``operator`` and keep them for :meth:`publish`;
        returns the number of rows. ``parallelism``: the operator's in the savepoint metadata
        (default: the writer's; a job restores it at any parallelism)."""
        if not isinstance(operator, str) or not operator:
            raise ConfigError(f"operator uid must be a non-empty string, got {operator!r}")
        info = as_info(state)
        states = self._tables.setdefault(operator, {})
        if info.name in states:
            raise ConfigError(f"operator {operator!r}, state {info.name!r} was added twice; add each state once")
        table = to_state_table(info, as_table(data), self.max_parallelism, Where(operator, info.name))
        states[info.name] = (info, table)
        if parallelism is not None:
            self._parallelism[operator] = parallelism
        return table.num_rows

    def add_operator(self, operator: str, states: Mapping[str, StateInfo], *, parallelism: int | None = None) -> None:
        """Declare ``operator``'s states without rows (a restore finds them registered, empty)."""
        for info in states.values():
            if info.name not in self._tables.get(operator, {}):
                self.add(operator, info, _empty(info), parallelism=parallelism)

    def publish(self) -> Any:
        """Write the tables, the manifest and the savepoint metadata; returns the metadata."""
        if not self._tables:
            raise ConfigError(f"savepoint {self.name!r}: no state was added; nothing to write")
        write.check_name_free(self.store, self.name)
        t0 = time.monotonic()
        self.job_id = write.ensure_job(self.store, self.job_id, self.max_parallelism)
        mid = write.new_mid(self.checkpoint_id)
        dir_ = write.data_dir(self.name, mid)
        ops = []
        progress = InProgress(self.store, self.name).start()  # keeps GC off the files while they are written
        try:
            with cf.ThreadPoolExecutor(self.options.upload_threads, thread_name_prefix="statelog-sp") as pool:
                pending: dict[str, dict[str, list[cf.Future[TableFile]]]] = {}
                for idx, uid in enumerate(sorted(self._tables)):
                    for n, (info, table) in self._tables[uid].items():
                        pending.setdefault(uid, {})[n] = write.write_tables(
                            self.store, dir_, idx, info, table, self.max_parallelism, self.options, pool)
                for uid in sorted(self._tables):
                    files = {n: write.join_files(fs) for n, fs in pending[uid].items()}
                    ops.append(write.OperatorTables(
                        uid, self._parallelism.get(uid, self.parallelism),
                        tuple(i for i, _ in self._tables[uid].values() if i.name not in TIMER_STATES), files))
            rows = sum(t.num_rows for s in self._tables.values() for _, t in s.values())
            stats = {"rows": rows, "files_written": sum(len(fs) for op in ops for fs in op.files.values()),
                     "duration_ms": round((time.monotonic() - t0) * 1000, 1)}
            self.published = write.publish(self.store, self.name, mid, self.job_id, self.max_parallelism,
                                           self.checkpoint_id, self.sources, ops, stats)
        except BaseException:
            progress.stop()
            write.remove_leftovers(self.store, self.name)
            raise
        progress.stop(delete=True)
        return self.published


def _empty(info: StateInfo) -> pa.Table:
    if info.name in TIMER_STATES:
        return pa.table({"key_bytes": pa.array([], pa.binary()), "timestamp": pa.array([], pa.int64())})
    if info.value_type is PICKLE or info.user_key_type is PICKLE:
        return pa.table({"key_bytes": pa.array([], pa.binary()), "value_pickle": pa.array([], pa.binary())})
    return pa.table({"key_bytes": pa.array([], pa.binary()), "value": pa.array([], table_schema(info).field("value").type)})
