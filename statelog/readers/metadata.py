"""The ``statelog-metadata`` data source: checkpoints, operators, states, subtasks,
materializations and table files of a job root, as small Spark tables.

::

    spark.read.format("statelog-metadata").option("root", ROOT).option("table", "states").load()

``table`` is one of :data:`TABLES` (default ``checkpoints``); ``checkpoint`` (an id,
``latest`` or ``savepoint:NAME``) restricts the rows to one checkpoint, else every retained
checkpoint and every savepoint is listed. The same rows back ``statelog inspect`` and the
``statelog_*`` views of ``statelog sql``. Schemas: docs/spark.md. The Spark data source is
:class:`statelog.spark.metadata.StatelogMetadataDataSource`; this module needs pyarrow only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from statelog.checkpoint.catalog import load_savepoint, savepoint_names
from statelog.checkpoint.metadata import CheckpointMetadata, MaterializedPart
from statelog.errors import CheckpointNotFoundError, ConfigError
from statelog.job import StateJob
from statelog.layout import (
    checkpoint_key,
    parse_savepoint_manifest_key,
    savepoint_manifest_key,
    savepoint_metadata_key,
)
from statelog.materialization.manifest import Manifest, TableFile, list_manifests, load_manifest
from statelog.readers import options as opt
from statelog.readers.restore import stream_state
from statelog.readers.schema import array_of
from statelog.types import PICKLE

_WHO = "checkpoint_id long, kind string, savepoint string"
SCHEMAS = {
    "checkpoints": f"{_WHO}, timestamp timestamp, job_id string, max_parallelism int, operators array<string>, "
                   "sources string, changelog_bytes long, segments int, materializations array<string>, "
                   "metadata_key string, metadata_bytes long",
    "operators": f"{_WHO}, operator string, parallelism int, states array<string>, changelog_ranges int, "
                 "changelog_bytes long, segments int, materialized_files int, materialized_rows long, "
                 "materialized_bytes long",
    "states": f"{_WHO}, operator string, state string, state_kind string, value_type string, "
              "user_key_type string, ttl_ms long, ttl_update string, internal boolean, changelog_ranges int, "
              "changelog_records long, changelog_bytes long, materialized_files int, materialized_rows long, "
              "materialized_bytes long",
    "subtasks": f"{_WHO}, operator string, subtask int, parallelism int, key_group_start int, "
                "key_group_end int, materialization array<struct<manifest:string,key_group_start:int,"
                "key_group_end:int>>, changelog_ranges int, changelog_bytes long, segments int",
    "materializations": "manifest string, id string, kind string, savepoint string, checkpoint_id long, "
                        "created timestamp, lease_generation long, operators array<string>, files int, "
                        "rows long, bytes long, referenced_by array<long>",
    "files": "manifest string, id string, operator string, state string, path string, key_group_start int, "
             "key_group_end int, rows long, bytes long, crc32 long",
}
TABLES = tuple(SCHEMAS)


def arrow_schema(table: str) -> pa.Schema:
    """The schema of metadata ``table`` in Spark's Arrow form (what ``format("statelog-metadata")``
    returns: ``long`` as ``int64``, ``timestamp`` as ``timestamp[us, UTC]``, ...)."""
    return parse_ddl(SCHEMAS[table])


# -- Spark DDL (the schemas above) ---------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|([<>,:()]))")
_SIMPLE = {"long": pa.int64(), "bigint": pa.int64(), "int": pa.int32(), "integer": pa.int32(), "string": pa.string(),
           "timestamp": pa.timestamp("us", tz="UTC"), "boolean": pa.bool_(), "double": pa.float64()}


def parse_ddl(ddl: str) -> pa.Schema:
    """A Spark DDL schema (``"a long, b array<struct<c:string>>"``) in Spark's Arrow form, without
    PySpark. Knows the types of :data:`SCHEMAS`; every field may be null."""
    tokens: list[str] = []
    pos = 0
    while pos < len(ddl.rstrip()):
        m = _TOKEN.match(ddl, pos)
        if m is None:
            raise ValueError(f"cannot parse DDL at {ddl[pos:pos + 20]!r}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    at = 0

    def take(expected: str | None = None) -> str:
        nonlocal at
        tok = tokens[at]
        if expected is not None and tok != expected:
            raise ValueError(f"DDL {ddl!r}: expected {expected!r}, found {tok!r}")
        at += 1
        return tok

    def data_type() -> pa.DataType:
        name = take().lower()
        if name == "array":
            take("<")
            elem = data_type()
            take(">")
            return array_of(elem)
        if name == "struct":
            take("<")
            fields = []
            while True:
                fname = take()
                take(":")
                fields.append(pa.field(fname, data_type(), True))
                if take() == ">":
                    return pa.struct(fields)
        if name not in _SIMPLE:
            raise ValueError(f"DDL {ddl!r}: unknown type {name!r}")
        return _SIMPLE[name]

    fields = []
    while at < len(tokens):
        fname = take()
        fields.append(pa.field(fname, data_type(), True))
        if at < len(tokens):
            take(",")
    return pa.schema(fields)


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _type(t: Any) -> str | None:
    return None if t is None else "pickle" if t is PICKLE else str(t)


class Catalog:
    """The checkpoints (and savepoints) and manifests of a job root, loaded once."""

    def __init__(self, job: StateJob, which: str | None = None, savepoints: bool = True) -> None:
        self.job = job
        self.store = job.store
        self.manifests: dict[str, Manifest] = {}
        self.entries: list[tuple[CheckpointMetadata, str | None, str]] = []  # meta, savepoint name, key
        self.restricted = which is not None
        if which is not None:
            meta = opt.resolve(job, which)
            name = which.strip()[len("savepoint:"):] if which.strip().startswith("savepoint:") else None
            key = savepoint_metadata_key(name) if name else checkpoint_key(meta.checkpoint_id)
            self.entries.append((meta, name, key))
        else:
            for cid in job.catalog.checkpoint_ids():
                try:
                    self.entries.append((job.catalog.load(cid), None, checkpoint_key(cid)))
                except CheckpointNotFoundError:
                    continue  # removed by retention meanwhile
            if savepoints:
                for name in savepoint_names(self.store):
                    self.entries.append((load_savepoint(self.store, name), name, savepoint_metadata_key(name)))

    def manifest(self, key: str | MaterializedPart) -> Manifest:
        return load_manifest(self.store, key, self.manifests)

    def _files(self, meta: CheckpointMetadata, uid: str, state: str | None = None) -> dict[str, TableFile]:
        """Table files the checkpoint's handles of ``uid`` read (of one state, or all)."""
        out: dict[str, TableFile] = {}
        for h in meta.operators[uid].subtasks:
            for p in h.materialization:
                mop = self.manifest(p).operators.get(uid)
                if mop is None:
                    continue
                names = [state] if state is not None else list(mop.files)
                for n in names:
                    for f in mop.files_for(n, p.key_groups):
                        out[f.path] = f
        return out

    # -- tables ----------------------------------------------------------------------------------

    def checkpoints(self) -> Iterator[tuple]:
        for meta, name, key in self.entries:
            head = self.store.head(key)
            yield (meta.checkpoint_id, meta.kind, name, _ts(meta.timestamp_ms), meta.job_id, meta.max_parallelism,
                   sorted(meta.operators), json.dumps(meta.sources, sort_keys=True), meta.changelog_bytes,
                   len(meta.segment_names()), sorted(meta.manifest_keys()), key,
                   None if head is None else head.size)

    def operators(self) -> Iterator[tuple]:
        for meta, name, _ in self.entries:
            for uid, op in sorted(meta.operators.items()):
                files = self._files(meta, uid)
                states = sorted(n for n in op.states if not n.startswith("__"))
                yield (meta.checkpoint_id, meta.kind, name, uid, op.parallelism, states,
                       sum(len(h.changelog) for h in op.subtasks), op.changelog_bytes,
                       len({s for h in op.subtasks for s in h.segment_names()}), len(files),
                       sum(f.rows for f in files.values()), sum(f.bytes for f in files.values()))

    def states(self) -> Iterator[tuple]:
        for meta, name, _ in self.entries:
            for uid, op in sorted(meta.operators.items()):
                for sname, info in sorted(op.states.items()):
                    ranges = {(r.stream, r.start, r.end): r for h in op.subtasks for r in h.changelog
                              if stream_state(r.stream) == sname}
                    files = self._files(meta, uid, sname)
                    yield (meta.checkpoint_id, meta.kind, name, uid, sname, info.kind.value, _type(info.value_type),
                           _type(info.user_key_type), None if info.ttl is None else info.ttl.ttl_ms,
                           None if info.ttl is None else info.ttl.update.value, sname.startswith("__"),
                           len(ranges), sum(e - s for (_, s, e) in ranges),
                           sum(r.bytes for r in ranges.values()), len(files),
                           sum(f.rows for f in files.values()), sum(f.bytes for f in files.values()))

    def subtasks(self) -> Iterator[tuple]:
        for meta, name, _ in self.entries:
            for uid, op in sorted(meta.operators.items()):
                for h in op.subtasks:
                    yield (meta.checkpoint_id, meta.kind, name, uid, h.subtask, h.parallelism, h.key_groups.start,
                           h.key_groups.end,
                           [(p.manifest, p.key_groups.start, p.key_groups.end) for p in h.materialization],
                           len(h.changelog), h.changelog_bytes, len(h.segment_names()))

    def _manifest_keys(self) -> list[tuple[str, str | None]]:
        if self.restricted:
            meta = self.entries[0][0]
            return [(k, None) for k in sorted(meta.manifest_keys())]
        keys: list[tuple[str, str | None]] = [(k, None) for k, *_ in list_manifests(self.store)]
        for name in savepoint_names(self.store):
            keys.append((savepoint_manifest_key(name), name))
        return keys

    def materializations(self) -> Iterator[tuple]:
        users: dict[str, list[int]] = {}
        for meta, name, _ in self.entries:
            if name is None:
                for k in meta.manifest_keys():
                    users.setdefault(k, []).append(meta.checkpoint_id)
        for key, sp in self._manifest_keys():
            m = self.manifest(key)
            if sp is None and m.kind == "savepoint":
                sp = parse_savepoint_manifest_key(key)
            files = sum(len(fs) for op in m.operators.values() for fs in op.files.values())
            yield (key, m.mid, m.kind, sp, m.checkpoint_id, _ts(m.created_ms), m.lease_generation,
                   sorted(m.operators), files, m.rows, m.bytes, sorted(users.get(key, [])))

    def files(self) -> Iterator[tuple]:
        for key, _ in self._manifest_keys():
            m = self.manifest(key)
            for uid, mop in sorted(m.operators.items()):
                for state, fs in sorted(mop.files.items()):
                    for f in fs:
                        yield (key, m.mid, uid, state, f.path, f.key_groups.start, f.key_groups.end, f.rows,
                               f.bytes, f.crc32)

    def rows(self, table: str) -> Iterator[tuple]:
        return getattr(self, table)()


def table_option(options: Mapping[str, str]) -> str:
    table = (opt.get(options, "table") or "checkpoints").strip().lower()
    if table not in SCHEMAS:
        raise ConfigError(f'option "table" must be one of {", ".join(TABLES)}, got {table!r}')
    return table


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opt.get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f'option "{name}" must be true or false, got {raw!r}')
