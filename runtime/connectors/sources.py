"""Sources with rewindable positions, and watermark strategies.

A source is split into **splits** (partitions) with stable ids. The job master enumerates
them and assigns split ``k`` (in sorted order) to source subtask ``k % parallelism``, so a
restore at another parallelism redistributes them. A :class:`SplitReader` reads one split
from a position, a small JSON-able dict that checkpoints record per split (in the
checkpoint's ``sources``) and that restores rewind to. :class:`SourceSplits` is the source
side of a task: the splits one subtask reads, with their timestamps and watermarks.

* :class:`GeneratorSource`: ``fn(split, index)`` for ``index`` in ``0..count-1`` of every
  split; position ``{"next": index}``. Deterministic, so the golden output of a job is known.
* :class:`~runtime.connectors.file_source.FileSource`: JSON lines files of a directory.
* :class:`~runtime.connectors.parquet_source.ParquetSource`: Parquet files of a directory.
* :class:`~runtime.connectors.kafka.KafkaSource`: Kafka topics.

All accept ``records_per_s`` (per source subtask) to pace a job, e.g. in tests.

**Batches**: ``env.from_source(source, uid, batches=True)`` makes the source task read
Arrow record batches (:meth:`SourceSplits.read_batch`, one batch of up to ``batch_rows``
rows per read) instead of records. A reader that has them natively returns them
(:class:`~runtime.connectors.parquet_source.ParquetSource`: the decoded Parquet batches,
no Python object per row); any other converts the records of one read with
:func:`records_to_batch`. A batch's position is the reader's after its last row, so the
positions of a checkpoint are the same as in record mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from runtime.api.functions import MAX_WATERMARK, MIN_WATERMARK
from runtime.errors import JobGraphError


@dataclass(frozen=True)
class WatermarkStrategy:
    """Event timestamps from ``timestamp_fn(value)`` (int ms) and bounded out-of-orderness
    watermarks: ``max timestamp seen - max_out_of_orderness_ms - 1`` per split, the minimum
    over the subtask's unfinished splits."""

    timestamp_fn: Callable[[Any], int]
    max_out_of_orderness_ms: int = 0


class SplitReader:
    """Reads one split sequentially from a position."""

    finished = False

    def read(self, max_records: int) -> list[Any]:
        raise NotImplementedError

    def read_batch(self, max_records: int) -> pa.RecordBatch | None:
        """Up to ``max_records`` rows as one record batch (None: nothing now); by default
        the records of :meth:`read` converted by :func:`records_to_batch`."""
        return records_to_batch(self.read(max_records))

    def position(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Source:
    """Base of sources: enumerates splits (in the driver) and reads them (in workers)."""

    records_per_s: float | None = None

    def splits(self) -> list[str]:
        raise NotImplementedError

    def check(self) -> None:
        """Raise a :class:`~runtime.errors.JobGraphError` when the source cannot work as
        configured (the job master calls it once, before the first attempt, so the job fails
        at once instead of through its restarts); by default nothing to check."""

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        raise NotImplementedError

    def open_splits(
        self,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
        *,
        subtask: int = 0,
        parallelism: int = 1,
        restored: bool = False,
    ) -> SourceSplits:
        """The reading side of source subtask ``subtask`` (in a worker): ``assigned`` maps its
        splits to their restored positions (``None``: from the start); ``restored`` says the job
        restored positions of this source. Sources that read their splits together (Kafka: one
        consumer) return their own :class:`SourceSplits`."""
        return SourceSplits(self, assigned, watermarks)


# -- generator -----------------------------------------------------------------------------------


class GeneratorSource(Source):
    """``count`` records per split: record ``i`` of split ``k`` is ``fn(k, i)``.

    ``count=None`` makes it unbounded.
    """

    def __init__(
        self,
        fn: Callable[[int, int], Any],
        count: int | None,
        splits: int = 1,
        records_per_s: float | None = None,
    ) -> None:
        if count is not None and (type(count) is not int or count < 0):
            raise JobGraphError(f"GeneratorSource count must be an int >= 0 or None, got {count!r}")
        if type(splits) is not int or splits < 1:
            raise JobGraphError(f"GeneratorSource splits must be an int >= 1, got {splits!r}")
        self.fn = fn
        self.count = count
        self.n_splits = splits
        self.records_per_s = records_per_s

    def splits(self) -> list[str]:
        return [f"{k:04d}" for k in range(self.n_splits)]

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        return _GeneratorReader(self.fn, int(split), self.count, int((position or {}).get("next", 0)))


class _GeneratorReader(SplitReader):
    def __init__(self, fn: Callable[[int, int], Any], split: int, count: int | None, start: int) -> None:
        self.fn, self.split, self.count, self.next = fn, split, count, start
        self.finished = count is not None and start >= count

    def read(self, max_records: int) -> list[Any]:
        stop = self.next + max_records
        if self.count is not None:
            stop = min(stop, self.count)
        fn, k = self.fn, self.split
        out = [fn(k, i) for i in range(self.next, stop)]
        self.next = stop
        if self.count is not None and stop >= self.count:
            self.finished = True
        return out

    def position(self) -> dict[str, Any]:
        return {"next": self.next}


def records_to_batch(records: list[Any]) -> pa.RecordBatch | None:
    """The records of one read as a record batch (None when there are none): dicts and
    dataclasses (e.g. :class:`~runtime.connectors.kafka.KafkaRecord`) give a column per field,
    named tuples per name; other values one column ``value``."""
    if not records:
        return None
    first = records[0]
    try:
        if isinstance(first, dict):
            return pa.RecordBatch.from_pylist(records)
        if dataclasses.is_dataclass(first):
            names = [f.name for f in dataclasses.fields(first)]
            return pa.RecordBatch.from_pylist([{k: getattr(r, k) for k in names} for r in records])
        if isinstance(first, tuple) and hasattr(first, "_asdict"):
            return pa.RecordBatch.from_pylist([r._asdict() for r in records])
        return pa.RecordBatch.from_pydict({"value": records})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise JobGraphError(
            f"the source's records do not convert to an Arrow record batch ({e}); with batches=True a "
            f"source must read records of one shape (dicts with the same value types), got e.g. {first!r:.200}"
        ) from None


# -- the source side of a task ------------------------------------------------------------------


class SourceSplits:
    """The splits one source subtask reads: round-robin batches, timestamps, watermarks."""

    def __init__(
        self,
        source: Source,
        assigned: dict[str, dict[str, Any] | None],
        watermarks: WatermarkStrategy | None,
    ) -> None:
        self.source = source
        self.watermarks = watermarks
        self.readers: dict[str, SplitReader] = {}
        self.max_ts: dict[str, int] = {}
        for split, pos in sorted(assigned.items()):
            self.readers[split] = source.reader(split, pos)
            if pos is not None and "max_ts" in pos:
                self.max_ts[split] = int(pos["max_ts"])
        self._order = list(self.readers)
        self._next = 0
        self.emitted = 0

    @property
    def finished(self) -> bool:
        return all(r.finished for r in self.readers.values())

    def read(self, max_records: int) -> list[tuple[Any, int | None]]:
        """Up to ``max_records`` records ``(value, timestamp)`` of the next unfinished split."""
        n = len(self._order)
        for _ in range(n):
            split = self._order[self._next % n]
            self._next += 1
            r = self.readers[split]
            if r.finished:
                continue
            values = r.read(max_records)
            if not values:
                continue
            self.emitted += len(values)
            ws = self.watermarks
            if ws is None:
                return [(v, None) for v in values]
            tsf = ws.timestamp_fn
            out = [(v, tsf(v)) for v in values]
            hi = max(ts for _, ts in out)
            if hi > self.max_ts.get(split, MIN_WATERMARK):
                self.max_ts[split] = hi
            return out
        return []

    def read_batch(self, max_records: int) -> list[tuple[pa.RecordBatch, None]]:
        """Up to ``max_records`` rows of the next unfinished split as one record batch
        ``[(batch, None)]`` (``[]``: nothing now); ``emitted`` counts rows. Batches carry no
        event timestamps (``from_source`` refuses watermarks with ``batches=True``)."""
        n = len(self._order)
        for _ in range(n):
            r = self.readers[self._order[self._next % n]]
            self._next += 1
            if r.finished:
                continue
            batch = r.read_batch(max_records)
            if batch is None or batch.num_rows == 0:
                continue
            self.emitted += batch.num_rows
            return [(batch, None)]
        return []

    def watermark(self) -> int:
        """The subtask's watermark: the minimum over unfinished splits (MAX when all finished)."""
        if self.watermarks is None:
            return MAX_WATERMARK if self.finished else MIN_WATERMARK
        lag = self.watermarks.max_out_of_orderness_ms + 1
        wm = MAX_WATERMARK
        for split, r in self.readers.items():
            if r.finished:
                continue
            ts = self.max_ts.get(split)
            wm = min(wm, MIN_WATERMARK if ts is None else ts - lag)
        return wm

    def snapshot_positions(self, checkpoint_id: int) -> dict[str, dict[str, Any]]:
        """The positions recorded in checkpoint ``checkpoint_id`` (at its barrier)."""
        return self.positions()

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed (e.g. Kafka commits its offsets for monitoring)."""

    def positions(self) -> dict[str, dict[str, Any]]:
        out = {}
        for split, r in self.readers.items():
            pos = dict(r.position())
            if split in self.max_ts:
                pos["max_ts"] = self.max_ts[split]
            out[split] = pos
        return out

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
