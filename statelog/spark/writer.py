"""Writing state from Spark into a savepoint: executors write the state tables of their key-group
units, the driver publishes the savepoint last (:mod:`statelog.state_processor.write`).

Two ways in:

* ``df.write.format("statelog")`` (:class:`SavepointDataWriter`, PySpark's Arrow writer API):
  one state of one operator into a new savepoint. The rows of one key-group unit must come in
  one partition (units are ``ceil(max_parallelism / 16)`` key groups; a unit's table is one
  file): :func:`by_unit` repartitions a DataFrame so. Each task checks and writes its units
  and returns their files as its commit message; ``commit`` (on the driver) refuses a unit
  written by two tasks and publishes the manifest, then the metadata; ``abort`` publishes
  nothing and deletes what the tasks wrote below ``savepoints/<name>/``. In-progress markers
  (:mod:`statelog.state_processor.progress`) keep GC off the unpublished savepoint: one when
  the write is planned, and one per running task.
* :func:`write_savepoint`: several DataFrames for several states of one savepoint; each is
  repartitioned with :func:`by_unit`, its tasks write their units (``mapInArrow``) and return
  the files, and the driver publishes once every state is written (on any failure it deletes
  what was written and publishes nothing).

Options of ``format("statelog")`` for writing: ``root``, ``savepoint``, ``operator``,
``state``, the state's description (``stateInfo``: the JSON of ``StateInfo.to_json()``, or
``kind``, ``valueType``, ``userKeyType`` (maps), ``ttlMs``), ``maxParallelism`` (required on a
root without a job), ``parallelism`` (the operator's in the metadata, default 1),
``store.*``. Columns: the state's view shape (docs/spark.md), as for
:class:`~statelog.state_processor.SavepointWriter`.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import IntegerType, StructField, StructType

from statelog.descriptors import StateInfo
from statelog.errors import ConfigError, ObjectExistsError
from statelog.layout import check_savepoint_name
from statelog.materialization.manifest import TableFile
from statelog.materialization.table_writer import MaterializeOptions
from statelog.readers import options as opt
from statelog.readers.state import key_groups
from statelog.state_processor import write
from statelog.state_processor.convert import Where, encoded, to_state_table
from statelog.state_processor.progress import InProgress, delete_markers, task_marker_first
from statelog.state_processor.writer import as_info, state_info
from statelog.store import open_store
from statelog.store.base import ObjectStore
from statelog.store.options import StoreOptions, resolve_store_options
from statelog.types import PICKLE

log = logging.getLogger(__name__)

UNIT_COLUMN = "__statelog_unit"


def _unit_batches(max_parallelism: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    unit = write.unit_size(max_parallelism, MaterializeOptions())
    for b in batches:
        t = pa.Table.from_batches([b])
        keys = encoded(t, "key_bytes", "key", Where("?", "?"), b"\x00") if b.num_rows else pa.array([], pa.binary())
        kgs = key_groups(keys.to_pylist(), max_parallelism) if b.num_rows else pa.array([], pa.int32())
        units = pa.array((kgs.to_numpy() // unit).astype("int32"), pa.int32())
        yield b.append_column(UNIT_COLUMN, units)


def by_unit(df: DataFrame, max_parallelism: int) -> DataFrame:
    """``df`` repartitioned so that the rows of each key-group unit are in one partition."""
    schema = StructType([*df.schema.fields, StructField(UNIT_COLUMN, IntegerType(), True)])
    units = MaterializeOptions().units
    with_unit = df.mapInArrow(partial(_unit_batches, max_parallelism), schema)
    return with_unit.repartition(min(units, max_parallelism), UNIT_COLUMN).drop(UNIT_COLUMN)


@dataclass(frozen=True)
class UnitTask:
    """What a task needs to write its units of one state (pickled to the executors)."""

    root: str
    store: StoreOptions
    name: str
    mid: str
    op_idx: int
    operator: str
    info: dict[str, Any]  # StateInfo.to_json()
    max_parallelism: int

    def run(self, batches: Iterator[pa.RecordBatch]) -> dict[str, Any]:
        """Check and write the rows of this task's units; returns the files and units."""
        store = open_store(self.root, dict(self.store) or None)
        # while the task consumes its input and writes, its own markers keep GC off the savepoint
        # (the driver's process, which plans and commits, may not live through a long stage);
        # afterwards the files it wrote are young and protect it until the driver commits
        progress = InProgress(store, self.name, first=task_marker_first()).start()
        try:
            return self._write(store, batches)
        finally:
            progress.stop(delete=True)
            store.close()

    def _write(self, store: ObjectStore, batches: Iterator[pa.RecordBatch]) -> dict[str, Any]:
        info = StateInfo.from_json(self.info)
        rows = [b for b in batches if b.num_rows]
        data = pa.Table.from_batches(rows) if rows else None
        if data is None:
            return {"files": [], "units": [], "rows": 0}
        if UNIT_COLUMN in data.column_names:
            data = data.drop_columns([UNIT_COLUMN])
        table = to_state_table(info, data, self.max_parallelism, Where(self.operator, info.name))
        options = MaterializeOptions()
        units = [r.start for r, _, _ in write.unit_ranges(table, self.max_parallelism, options)]
        try:
            with cf.ThreadPoolExecutor(options.upload_threads) as pool:
                files = write.join_files(write.write_tables(store, write.data_dir(self.name, self.mid), self.op_idx,
                                                            info, table, self.max_parallelism, options, pool))
        except ObjectExistsError:  # another task wrote the same unit's file with other rows
            raise split_unit(self.operator, info.name, units[0]) from None
        return {"files": [f.to_json() for f in files], "units": units, "rows": table.num_rows}


@dataclass
class UnitsWritten(WriterCommitMessage):
    result: dict[str, Any]


def _info_from_options(options: Mapping[str, str], name: str) -> StateInfo:
    raw = opt.get(options, "stateInfo")
    if raw is not None:
        try:
            info = StateInfo.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f'option "stateInfo" is not the JSON of a state description: {e}') from None
        if info.name != name:
            raise ConfigError(f'option "stateInfo" describes state {info.name!r}, option "state" is {name!r}')
        return info
    if name.startswith("__timers"):
        return as_info(name)
    kind = opt.require(options, "kind", "the state kind: value, list, map, reducing or aggregating")
    value_type = _type(opt.require(options, "valueType", "the value type (an Arrow type name, or pickle)"))
    ukt = opt.get(options, "userKeyType")
    ttl = opt.get(options, "ttlMs")
    return state_info(name, kind, value_type, None if ukt is None else _type(ukt), None if ttl is None else int(ttl))


def _type(name: str) -> Any:
    if name.strip().lower() == "pickle":
        return PICKLE
    try:
        return pa.type_for_alias(name.strip())
    except (ValueError, KeyError):
        raise ConfigError(f"unknown Arrow type name {name!r}; use e.g. int64, string, double, bool, binary "
                          "or pickle (for a description with nested types, give stateInfo)") from None


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    raw = opt.get(options, name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"option {name!r} is {raw!r}, expected an integer") from None


class SavepointDataWriter(DataSourceArrowWriter):
    """``df.write.format("statelog")``: one state into a new savepoint (see the module doc)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        root, store_opts = opt.job_store(options)
        self.name = check_savepoint_name(opt.require(options, "savepoint", "the name of the savepoint to write"))
        operator = opt.require(options, "operator", "the operator uid")
        info = _info_from_options(options, opt.require(options, "state", "the state name"))
        self.parallelism = _int_option(options, "parallelism") or 1
        store = open_store(root, dict(store_opts) or None)
        try:
            job_id, maxp = write.job_of_root(store, _int_option(options, "maxParallelism"))
            write.check_name_free(store, self.name)
            self.job_id = write.ensure_job(store, job_id, maxp)
            InProgress(store, self.name).mark()  # the write has begun: until its tasks' files and markers
        finally:
            store.close()
        self.task = UnitTask(root, store_opts, self.name, write.new_mid(0), 0, operator, info.to_json(), maxp)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> UnitsWritten:
        return UnitsWritten(self.task.run(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        t = self.task
        results = [m.result for m in messages if isinstance(m, UnitsWritten)]
        store = open_store(t.root, dict(t.store) or None)
        try:
            try:
                files = _files(results, t.operator, StateInfo.from_json(t.info).name)
                info = StateInfo.from_json(t.info)
                user = () if info.name.startswith("__timers") else (info,)
                write.publish(store, t.name, t.mid, self.job_id, t.max_parallelism, 0, {},
                              [write.OperatorTables(t.operator, self.parallelism, user, {info.name: files})],
                              {"rows": sum(r["rows"] for r in results), "files_written": len(files)})
                delete_markers(store, t.name)
            except BaseException:
                write.remove_leftovers(store, t.name)
                raise
        finally:
            store.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        t = self.task
        store = open_store(t.root, dict(t.store) or None)
        try:
            n = write.remove_leftovers(store, t.name)
            log.warning("savepoint %r: the write failed; nothing was published, %d object(s) removed", t.name, n)
        finally:
            store.close()


def split_unit(operator: str, state: str, kg: int) -> ConfigError:
    return ConfigError(
        f"operator {operator!r}, state {state!r}: the rows of a key-group unit (near key group {kg}) came in more "
        "than one partition; repartition with statelog.spark.writer.by_unit(df, max_parallelism) or use "
        "statelog.spark.writer.write_savepoint")


def _files(results: list[dict[str, Any]], operator: str, state: str) -> list[TableFile]:
    seen: set[int] = set()
    files = []
    for r in results:
        twice = seen & set(r["units"])
        if twice:
            raise split_unit(operator, state, min(twice))
        seen |= set(r["units"])
        files += [TableFile.from_json(f) for f in r["files"]]
    return files


def write_savepoint(root: str, name: str, states: Mapping[tuple[str, str], tuple[StateInfo | Any, DataFrame]], *,
                    max_parallelism: int | None = None, parallelism: int | Mapping[str, int] = 1,
                    sources: Mapping[str, Any] | None = None, checkpoint_id: int = 0,
                    store_options: Mapping[str, Any] | None = None) -> Any:
    """Write savepoint ``name`` from one DataFrame per (operator, state); returns its metadata.

    ``states`` maps ``(operator uid, state name)`` to ``(description, DataFrame)`` (a
    descriptor, a ``StateInfo`` or, for timers, the pseudo-state's name). Executors write
    the tables of their units; this process publishes once all are written, or on a failure
    deletes what was written and publishes nothing.
    """
    name = check_savepoint_name(name)
    resolved = resolve_store_options(root, store_options)  # with this process's AWS_* environment
    store = open_store(root, dict(resolved) or None)
    try:
        job_id, maxp = write.job_of_root(store, max_parallelism)
        write.check_name_free(store, name)
        job_id = write.ensure_job(store, job_id, maxp)
        mid = write.new_mid(checkpoint_id)
        uids = sorted({uid for uid, _ in states})
        per_op: dict[str, dict[str, tuple[StateInfo, list[TableFile]]]] = {}
        rows = 0
        progress = InProgress(store, name).start()  # keeps GC off the executors' files while the job runs
        try:
            for (uid, _state), (desc, df) in states.items():
                info = as_info(desc)
                task = UnitTask(root, resolved, name, mid, uids.index(uid), uid, info.to_json(), maxp)
                out = by_unit(df, maxp).mapInArrow(partial(_task_rows, task), "result string").collect()
                results = [json.loads(r["result"]) for r in out]
                rows += sum(r["rows"] for r in results)
                per_op.setdefault(uid, {})[info.name] = (info, _files(results, uid, info.name))
            ops = [write.OperatorTables(
                uid, parallelism if isinstance(parallelism, int) else parallelism.get(uid, 1),
                tuple(i for i, _ in per_op[uid].values() if not i.name.startswith("__timers")),
                {n: fs for n, (_, fs) in per_op[uid].items()}) for uid in uids]
            meta = write.publish(store, name, mid, job_id, maxp, checkpoint_id, dict(sources or {}), ops,
                                 {"rows": rows, "files_written": sum(len(fs) for o in ops for fs in o.files.values())})
        except BaseException:
            progress.stop()
            write.remove_leftovers(store, name)
            raise
        progress.stop(delete=True)
        return meta
    finally:
        store.close()


def _task_rows(task: UnitTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    result = task.run(batches)
    yield pa.RecordBatch.from_pydict({"result": [json.dumps(result)]})
