"""What a restore read: :class:`RestoredChanges`, and the entries of a state table.

A :class:`RestoredChanges` holds what a restore read from the handles of a checkpoint,
restricted to the key groups of the restoring subtask: the materialized base tables per
state and the change records of the tail after them, grouped per state in replay order
(:meth:`RestoredChanges.load` reads the table files, by a thread pool, and the changelog
ranges :func:`statelog.restore.plan.plan_reads` listed). :func:`base_entries` turns a state
table into the keys, namespaces and entries the backend installs.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import pyarrow as pa

from statelog.arrays import all_equal_bytes, integer_numpy
from statelog.changelog.reader import SegmentReader
from statelog.checkpoint.metadata import ChangelogRange, MaterializedPart
from statelog.descriptors import StateInfo, StateKind
from statelog.keys.columns import decode_key_array, encode_int64_keys, int64_key_array
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import TableFile
from statelog.materialization.table_image import image_rows, load_image
from statelog.materialization.table_reader import read_table_file
from statelog.materialization.table_schema import decode_values
from statelog.store.base import ObjectStore

__all__ = ["BaseFile", "RestoredChanges", "base_entries"]

# a materialized table file to read: its state, the file, the key groups to read of it
BaseFile = tuple[StateInfo, TableFile, KeyGroupRange]


def base_entries(info: StateInfo, table: pa.Table, raw_keys: bool = False) -> tuple[Any, list[bytes], Any]:
    """Keys, namespaces and in-memory entries (TTL: ``[value, expires]``) of a state table
    (or of a table image's rows: int64 keys); ``raw_keys``: the keys' bytes instead of the
    decoded keys (a disk-backed working set). Int64 keys come as an int64 numpy array (no key
    objects: :func:`statelog.restore.appliers.put_items` installs them), and so do the values
    of a value state of int64s without TTL."""
    col = table.column("key")
    ints = integer_numpy(col) if col.type == pa.int64() else None  # a table image's keys, decoded
    keys: Any
    if raw_keys:
        keys = (encode_int64_keys(ints) if ints is not None else col).to_pylist()
    else:
        if ints is None:
            ints = int64_key_array(col)
        keys = ints if ints is not None else decode_key_array(col)
    nss = _namespaces(table.column("namespace"))
    values: Any
    value_col = table.column("value")
    if (
        not raw_keys and info.ttl is None and info.kind is StateKind.VALUE
        and value_col.type == pa.int64() and value_col.null_count == 0
    ):  # fmt: skip
        values = integer_numpy(value_col)
    else:
        values = decode_values(info, table)
    if info.ttl is not None:
        # (a table image of a value state leaves out an expires_ms column of nulls only)
        exps = table.column("expires_ms").to_pylist() if "expires_ms" in table.column_names else [None] * len(values)
        if info.kind is StateKind.LIST:
            values = [[[v, x] for v, x in zip(vs, xs, strict=True)] for vs, xs in zip(values, exps, strict=True)]
        elif info.kind is StateKind.MAP:
            values = [
                {k: [v, x] for (k, v), x in zip(m.items(), xs, strict=True)}
                for m, xs in zip(values, exps, strict=True)
            ]
        else:
            values = [[v, x] for v, x in zip(values, exps, strict=True)]
    return keys, nss, values


def _namespaces(col: pa.ChunkedArray) -> list[bytes]:
    """The namespace of each row; one shared ``bytes`` object when every row has the same one
    (as in a state without namespaces: no object per row)."""
    n = len(col)
    if pa.types.is_dictionary(col.type):  # (a table image's: the distinct namespaces and an index a row)
        names = {ns for chunk in col.chunks if len(chunk) for ns in chunk.dictionary.to_pylist()}
        if len(names) == 1 and col.null_count == 0:  # (one namespace, as a state without namespaces has)
            return [names.pop()] * n
        return col.to_pylist()
    if n and col.null_count == 0:
        first = col[0].as_py()
        if all_equal_bytes(col, first):
            return [first] * n
    return col.to_pylist()


def _read_base(store: ObjectStore, f: TableFile, kgr: KeyGroupRange, info: StateInfo) -> pa.Table:
    """The rows of ``kgr`` of a table file: from its image if there is one, else the file."""
    image = load_image(store, f)
    return image_rows(image, kgr) if image is not None else read_table_file(store, f, kgr, info)


class RestoredChanges:
    """What a restore reads from checkpoint handles: materialized base tables per state, then
    change records grouped per state, in replay order."""

    def __init__(self) -> None:
        self.infos: dict[str, StateInfo] = {}
        # per state (timers included): its materialized tables, turned into entries when the
        # state registers
        self.base: dict[str, list[pa.Table]] = {}
        self.records: dict[str, list[tuple[bytes, bytes, int, Any, Any, int | None]]] = {}
        self.parts: list[MaterializedPart] = []
        self.inherited: list[ChangelogRange] = []
        self.checkpoint_id: int | None = None
        self.base_checkpoint_id = -1
        self.bytes_read = 0
        self.base_rows = 0
        self.records_read = 0

    def load(
        self, reader: SegmentReader, files: list[BaseFile], ranges: list[ChangelogRange], images: bool = False
    ) -> None:
        """Read ``files`` and ``ranges`` (as :func:`statelog.restore.plan.plan_reads` listed
        them, or a part of them); ``images``: a table file's rows from its table image in the
        local copies where there is one (for a backend: the keys come decoded)."""
        store = reader.store
        before = reader.bytes_read
        # Table files are fetched and decoded by a thread pool (I/O and Parquet decoding release
        # the GIL) while this thread reads the changelog tail; keys and entries of the tables
        # are built only after the pool finished: decoding keys while the pool runs would make
        # the pool's threads wait for the GIL at every Python step.
        pool = cf.ThreadPoolExecutor(min(4, len(files)), thread_name_prefix="statelog-restore") if files else None
        try:
            read = _read_base if images else read_table_file
            futures = [pool.submit(read, store, f, kgr, info) for info, f, kgr in files] if pool else []
            for sub_r in ranges:
                for batch in reader.read_range(sub_r.stream, sub_r.start, sub_r.end, sub_r.key_groups, sub_r.segments):
                    recs = self.records.setdefault(batch.state, [])
                    for _seq, _kg, op, kb, nsb, ukey, value, exp in batch.rows():
                        recs.append((kb, nsb, op, ukey, value, exp))
                    self.records_read += batch.table.num_rows
            tables = [f.result() for f in futures]
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        for (info, f, _kgr), table in zip(files, tables, strict=True):
            self.bytes_read += f.bytes
            if table.num_rows:  # turned into keys and entries when the state is registered
                self.base.setdefault(info.name, []).append(table)
                self.base_rows += table.num_rows
        self.bytes_read += reader.bytes_read - before
