"""The engine's options: the changelog writer's (:class:`WriterOptions`) and the ranges of the
state job's own (``statelog.open``: ``state_store``, ``state_memory``, ``retain_checkpoints``,
``writer_lease_ttl_s``), which the runtime and the materializer take over where they mean the same.

The tables of ``docs/runtime.md`` and ``docs/store.md`` list them; a value outside its range is a
:class:`~statelog.errors.ConfigError` naming the option, the range and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from statelog.changelog.format import SPLIT_BLOCK_ROWS, SPLIT_MIN_ROWS, Codec
from statelog.errors import ConfigError
from statelog.options.base import Options, check_bool, check_optional_bool, option
from statelog.options.values import DAY, HOUR, Count, Duration, Size
from statelog.store.retry import RetryPolicy

# the state job (statelog/job.py StateJob; statelog.open and the runtime's environment)
STATE_MEMORY = Size("state_memory", 1 << 20, 1 << 44)
STATE_STORES = ("memory", "disk")
DEFAULT_STATE_MEMORY = 512 << 20
# the checkpoints GC keeps (StateJob, the runtime, the materializer daemon and `statelog gc`)
RETAIN = Count("retain_checkpoints", 1, 1_000_000)
WRITER_LEASE_TTL = Duration("writer_lease_ttl_s", 0.05, HOUR)

# the changelog writer (statelog/changelog/writer.py; writer_options of statelog.open and the runtime)
PERSIST_DELAY = Duration("persist_delay", 0.0, DAY)
FLUSH_RECORDS = Count("flush_records", 1, 1 << 30)
MAX_BUFFERED_RECORDS = Count("max_buffered_records", 1, 1 << 32)
MAX_INFLIGHT_BYTES = Size("max_inflight_bytes", 1, 1 << 40)  # bytes of segments being uploaded
UPLOAD_THREADS = Count("upload_threads", 1, 64)
ENCODE_BATCH_RECORDS = Count("encode_batch_records", 1, 1 << 24)
COMPRESSION_LEVEL = Count("compression_level", -7, 22)  # zstd's levels (negative: faster)
SPLIT_ROWS = Count("split_rows", 1, 1 << 30)


def check_state_store(label: str, value: Any) -> str:
    """``"memory"`` (Python dicts) or ``"disk"`` (statelog/state/tables/disk/)."""
    if value not in STATE_STORES:
        raise ConfigError(
            f"{label} must be 'memory' (keyed state in Python dicts) or 'disk' (on local disk under "
            f"a cache of state_memory bytes), got {value!r}"
        )
    return value


def check_state_dir(label: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ConfigError(f"{label} must be a local directory path, got {value!r}")
    return os.fspath(value)


def check_codec(label: str, value: Any) -> Codec:
    try:
        return Codec(value.value if isinstance(value, Codec) else value)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{label} must be one of {', '.join(c.value for c in Codec)} (changelog block codec), got {value!r}"
        ) from None


def check_retry(label: str, value: Any) -> RetryPolicy:
    if not isinstance(value, RetryPolicy):
        raise ConfigError(f"{label} must be a statelog.store.retry.RetryPolicy, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class WriterOptions(Options):
    """The process-wide changelog writer's options (:class:`statelog.changelog.writer.ChangelogWriter`;
    ``writer_options`` of ``statelog.open`` and of the runtime; ``docs/architecture.md``)."""

    KIND: ClassVar[str] = "changelog writer option"

    persist_delay: float = option(0.25, "seconds a change may wait in memory before a flush uploads it",
                                  PERSIST_DELAY)
    flush_records: int = option(50_000, "a flush starts as soon as this many records are buffered",
                                FLUSH_RECORDS)
    max_buffered_records: int = option(500_000, "tasks block (back-pressure) above this many buffered records",
                                       MAX_BUFFERED_RECORDS)
    max_inflight_bytes: int = option(64 << 20, "flushes wait while this many bytes are being uploaded",
                                     MAX_INFLIGHT_BYTES)
    upload_threads: int = option(2, "segment uploads running at once", UPLOAD_THREADS)
    coalesce: bool = option(False, "keep only the last change per key and state within one flush", check_bool)
    compression_level: int = option(1, "zstd level of the blocks", COMPRESSION_LEVEL)
    compression: Codec = option(Codec.ZSTD, "block codec: zstd, lz4 or none (readers accept every one)",
                                check_codec)
    retry: RetryPolicy = option(RetryPolicy(), "retries of a failed segment upload", check_retry)
    encode_in_task: bool = option(True, "tasks convert their own full batches to Arrow (else the flusher does)",
                                  check_bool)
    encode_batch_records: int = option(4096, "records per batch a task converts at once", ENCODE_BATCH_RECORDS)
    columnar: bool | None = option(None, "columnar record buffers for narrow streams (None: when the C "
                                   "extension is built and STATELOG_PURE_PYTHON is unset)", check_optional_bool)
    split_min_rows: int = option(SPLIT_MIN_ROWS, "a stream's records in a segment from this many rows on are split "
                                 "into blocks by key-group range (docs/format.md 4.2)", SPLIT_ROWS)
    split_block_rows: int = option(SPLIT_BLOCK_ROWS, "rows of such a block, about (a key group is never split)",
                                   SPLIT_ROWS)
