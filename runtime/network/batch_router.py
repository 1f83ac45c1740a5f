"""Split an Arrow record batch to the subtasks that own its keys, a column at a time.

:func:`split_by_key_group` is the batch form of :class:`runtime.network.router`'s keyed
routing: the key groups of a key column come from :func:`statelog.keys.batch.key_groups_of`
(the same encoding and hash as ``key_group_of`` per record), the owning subtask is
``key_group * parallelism // max_parallelism`` (``subtask_for_key_group``) over the whole
array, and each subtask gets the rows it owns in their order in the batch.

:class:`ColumnKey` is the key selector of ``key_by("column")``: a hash edge keyed by it
splits each record batch with :func:`split_by_key_group` (one frame per subtask's part), and
routes any other element by ``element[column]`` (e.g. a dict record) as a callable selector.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from statelog.errors import ConfigError
from statelog.keys.batch import encode_keys, key_groups_of


class ColumnKey:
    """The key of ``key_by(name)``: column ``name`` of a record batch, or ``record[name]``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, record: Any) -> Any:
        if isinstance(record, pa.RecordBatch):
            raise ConfigError(
                f"a record batch reached a per-record keyed operator (key_by({self.name!r})): on a stream of "
                "batches use process_batches(...) or aggregate(...), or read records (from_source without batches=True)"
            )
        return record[self.name]

    def __repr__(self) -> str:
        return f"ColumnKey({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ColumnKey) and other.name == self.name

    def __hash__(self) -> int:
        return hash((ColumnKey, self.name))


def subtasks_of(keys: pa.Array, max_parallelism: int, parallelism: int) -> np.ndarray:
    """The subtask index of every key of ``keys`` (int64)."""
    _, kbs = encode_keys(keys)
    groups = key_groups_of(kbs, max_parallelism).astype(np.int64)
    return groups * parallelism // max_parallelism


def split_by_key_group(batch: pa.RecordBatch, key: str, max_parallelism: int,
                       parallelism: int) -> list[pa.RecordBatch | None]:  # fmt: skip
    """One batch per subtask (``None`` where it owns no row of ``batch``), routed by column ``key``."""
    if key not in batch.schema.names:
        raise ConfigError(f"key_by column {key!r} is not in the batch (its columns: {batch.schema.names}); "
                          "name one of them")
    if batch.num_rows == 0:
        return [None] * parallelism
    owners = subtasks_of(batch[key], max_parallelism, parallelism)
    if parallelism == 1:
        return [batch]
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(parallelism + 1))
    taken = batch.take(pa.array(order))
    return [taken.slice(int(lo), int(hi - lo)) if hi > lo else None
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]  # fmt: skip
