"""``statelog savepoint write``: one state of one operator from Parquet files into a new savepoint
(:class:`statelog.state_processor.SavepointWriter`)."""

from __future__ import annotations

import argparse
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from statelog.errors import ConfigError
from statelog.state_processor import SavepointWriter, state_info
from statelog.state_processor.writer import as_info
from statelog.types import PICKLE
from tools.cli.output import _console, _json

EXIT_OK = 0


def declare_savepoint_write(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", metavar="FILE", nargs="+",
                   help="Parquet files with the state's rows in the shape of its SQL view (key or key_bytes, "
                        "namespace or namespace_bytes, value or value_pickle, expires_ms; timers: timestamp)")
    p.add_argument("--name", metavar="NAME", required=True, help="the new savepoint's name")
    p.add_argument("--operator", metavar="UID", required=True, help="the operator uid")
    p.add_argument("--state", metavar="STATE", required=True,
                   help="the state name (or __timers_event / __timers_processing)")
    p.add_argument("--kind", metavar="KIND", help="value, list, map, reducing or aggregating")
    p.add_argument("--value-type", metavar="TYPE", help="Arrow type name of the values (int64, string, ...) or pickle")
    p.add_argument("--user-key-type", metavar="TYPE", help="map states: Arrow type name of the map keys, or pickle")
    p.add_argument("--ttl-ms", metavar="MS", type=int, help="the state's TTL in milliseconds")
    p.add_argument("--max-parallelism", metavar="N", type=int,
                   help="key groups; required on a root without a job, else the job's")
    p.add_argument("--parallelism", metavar="P", type=int, default=1,
                   help="the operator's parallelism in the savepoint metadata (a job restores it at any)")


def _type(name: str | None, what: str) -> Any:
    if name is None:
        raise ConfigError(f"{what} is required (an Arrow type name such as int64 or string, or pickle)")
    if name.strip().lower() == "pickle":
        return PICKLE
    try:
        return pa.type_for_alias(name.strip())
    except (ValueError, KeyError):
        raise ConfigError(f"{what} {name!r} is not an Arrow type name; use e.g. int64, string, double or pickle") from None


def _read(files: list[str]) -> pa.Table:
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f))
        except FileNotFoundError:
            raise ConfigError(f"Parquet file {f} does not exist") from None
        except (OSError, pa.ArrowInvalid) as e:
            raise ConfigError(f"cannot read Parquet file {f}: {e}") from None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ConfigError(f"the files' schemas differ: {e}; give files of one schema") from None


def cmd_savepoint_write(args: argparse.Namespace, options: dict[str, Any]) -> int:
    if args.state.startswith("__timers"):
        info = as_info(args.state)
    else:
        if args.kind is None:
            raise ConfigError("--kind is required: value, list, map, reducing or aggregating")
        ukt = _type(args.user_key_type, "--user-key-type") if args.user_key_type is not None else None
        info = state_info(args.state, args.kind, _type(args.value_type, "--value-type"), ukt, args.ttl_ms)
    table = _read(args.files)
    with SavepointWriter(args.root, args.name, max_parallelism=args.max_parallelism, parallelism=args.parallelism,
                         store_options=options or None) as w:
        rows = w.add(args.operator, info, table)
        meta = w.publish()
    result = {"savepoint": args.name, "restore": f"savepoint:{args.name}", "rows": rows,
              "files": meta.stats["files"], "bytes": meta.stats["bytes"], "max_parallelism": meta.max_parallelism}
    if args.json:
        _json(result)
    else:
        _console().print(f"wrote savepoint {args.name!r} to {args.root}: {rows} rows in {result['files']} files "
              f"({result['bytes']} bytes); start a job with restore=\"savepoint:{args.name}\"", soft_wrap=True)
    return EXIT_OK
