"""Options shared by the Spark data sources and jobs: the job root, store options, checkpoints.

Spark hands a Python data source its options as strings with lower-cased keys. Store
options (``open_store``'s mapping, e.g. the S3 endpoint and credentials) are passed as
``store.<name>`` options and ``store.retry.<field>`` for the retry policy. The driver
resolves them once, with its own ``AWS_*`` environment, into explicit
:class:`~statelog.store.options.StoreOptions` (:func:`job_store`) that travel to the
executors inside the pickled plan of the reader, so the Python workers open the store
exactly like the driver even on a cluster whose executors lack that environment. Error
messages name option keys, never their values (they may be secrets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statelog.checkpoint.metadata import CheckpointMetadata, OperatorState
from statelog.descriptors import StateInfo
from statelog.errors import ConfigError, StateNotFoundError
from statelog.job import StateJob
from statelog.options.values import parse_checkpoint_ref
from statelog.store.options import StoreOptions, resolve_store_options

STORE_PREFIX = "store."


def get(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option by case-insensitive name (Spark lower-cases keys; plain dicts may not)."""
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return default


def require(options: Mapping[str, str], name: str, what: str) -> str:
    value = get(options, name)
    if value is None or not str(value).strip():
        raise ConfigError(f'option "{name}" is required: {what}')
    return str(value).strip()


def store_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The ``store.*`` options as an ``open_store`` mapping (``store.retry.X`` -> ``retry[X]``)."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        low = key.lower()
        if not low.startswith(STORE_PREFIX):
            continue
        name = low[len(STORE_PREFIX):]
        if name.startswith("retry."):
            field = name.split(".", 1)[1]
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f'option "{key}" needs a number') from None
            out.setdefault("retry", {})[field] = int(number) if number.is_integer() and "." not in str(value) \
                else number
        elif name:
            out[name] = value
    return out


def to_spark_options(store_opts: Mapping[str, Any] | None) -> dict[str, str]:
    """The inverse of :func:`store_options`: data source options for an ``open_store`` mapping."""
    out: dict[str, str] = {}
    for k, v in (store_opts or {}).items():
        if k == "retry" and isinstance(v, Mapping):
            for f, n in v.items():
                out[f"{STORE_PREFIX}retry.{f}"] = str(n)
        elif v is not None:
            out[f"{STORE_PREFIX}{k}"] = str(v)
    return out


def job_store(options: Mapping[str, str]) -> tuple[str, StoreOptions]:
    """Option ``root`` and its store options resolved with this process's environment (driver side)."""
    root = require(options, "root", "the job root URL, e.g. file:///var/lib/job or s3://bucket/prefix")
    return root, resolve_store_options(root, store_options(options))


def open_at(root: str, store: Mapping[str, Any]) -> StateJob:
    """Open the job at ``root`` read-only with resolved store options (never creates a job root)."""
    return StateJob(root, store_options=store or None, create=False)


def open_job(options: Mapping[str, str]) -> StateJob:
    """Open the job at option ``root`` read-only (never creates a job root)."""
    return open_at(*job_store(options))


def parse_partitions(options: Mapping[str, str], default: int, max_parallelism: int) -> int:
    raw = get(options, "partitions")
    if raw is None:
        return max(1, min(default, max_parallelism))
    if not str(raw).strip().isdigit() or not 1 <= int(raw) <= max_parallelism:
        raise ConfigError(
            f'option "partitions" must be a whole number in 1..{max_parallelism} (the job\'s '
            f"max_parallelism: a partition holds at least one key group), got {raw!r}"
        )
    return int(raw)


def resolve(job: StateJob, which: str | None, option: str = "checkpoint") -> CheckpointMetadata:
    """The checkpoint or savepoint named by ``which``: ``latest`` (default), an id or ``savepoint:NAME``."""
    ref = parse_checkpoint_ref(which or "latest", f'option "{option}"')  # the one parser
    meta = job.resolve_checkpoint(str(ref))
    if meta is None:
        raise ConfigError(f"{job.root} has no retained checkpoint yet (option \"{option}\" is latest)")
    return meta


def describe(meta: CheckpointMetadata, name: str | None = None) -> str:
    if meta.kind == "savepoint":
        return f"savepoint {name!r} (of checkpoint {meta.checkpoint_id})" if name else \
            f"savepoint of checkpoint {meta.checkpoint_id}"
    return f"checkpoint {meta.checkpoint_id}"


def operator_of(meta: CheckpointMetadata, uid: str, where: str) -> OperatorState:
    op = meta.operators.get(uid)
    if op is None:
        known = ", ".join(sorted(meta.operators)) or "none"
        raise StateNotFoundError(f"operator {uid!r} does not exist in {where} (operators: {known})")
    return op


def state_of(op: OperatorState, name: str, where: str) -> StateInfo:
    info = op.states.get(name)
    if info is None:
        known = ", ".join(sorted(op.states)) or "none"
        raise StateNotFoundError(
            f"state {name!r} does not exist for operator {op.uid!r} in {where} (states: {known})"
        )
    return info
