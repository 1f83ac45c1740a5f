"""Sources with rewindable positions, and watermark strategies.

A source is split into **splits** (partitions) with stable ids. The job master enumerates
them and assigns split ``k`` (in sorted order) to source subtask ``k % parallelism``, so a
restore at another parallelism redistributes them. A :class:`SplitReader` reads one split
from a position, a small JSON-able dict that checkpoints record per split (in the
checkpoint's ``sources``) and that restores rewind to:

* :class:`GeneratorSource`: ``fn(split, index)`` for ``index`` in ``0..count-1`` of every
  split; position ``{"next": index}``. Deterministic, so the golden output of a job is known.
* :class:`FileSource`: one split per file (``*.jsonl`` by default, one JSON value per line)
  of a directory; append-only files; position ``{"offset": records read, "byte": byte offset}``.

Both accept ``records_per_s`` (per source subtask) to pace a job, e.g. in tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import JobGraphError
from runtime.functions import MAX_WATERMARK, MIN_WATERMARK


@dataclass(frozen=True)
class WatermarkStrategy:
    """Event timestamps from ``timestamp_fn(value)`` (int ms) and bounded out-of-orderness
    watermarks: ``max timestamp seen - max_out_of_orderness_ms - 1`` per split, the minimum
    over the subtask's unfinished splits."""

    timestamp_fn: Callable[[Any], int]
    max_out_of_orderness_ms: int = 0

    @staticmethod
    def for_bounded_out_of_orderness(timestamp_fn: Callable[[Any], int], max_out_of_orderness_ms: int) -> WatermarkStrategy:
        return WatermarkStrategy(timestamp_fn, max_out_of_orderness_ms)

    @staticmethod
    def for_monotonous_timestamps(timestamp_fn: Callable[[Any], int]) -> WatermarkStrategy:
        return WatermarkStrategy(timestamp_fn, 0)


class SplitReader:
    """Reads one split sequentially from a position."""

    finished = False

    def read(self, max_records: int) -> list[Any]:
        raise NotImplementedError

    def position(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Source:
    """Base of sources: enumerates splits (in the driver) and reads them (in workers)."""

    records_per_s: float | None = None

    def splits(self) -> list[str]:
        raise NotImplementedError

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        raise NotImplementedError


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


# -- files ---------------------------------------------------------------------------------------


class FileSource(Source):
    """JSON lines files of a directory, one split per file (matched by ``pattern``).

    Files are append-only: a restore seeks to the recorded byte offset. With
    ``bounded=True`` a split finishes at the end of its file (a last line without newline
    counts); otherwise it waits for more lines (files appearing later are not discovered).
    ``parse`` turns one line (bytes, without newline) into a record (default ``json.loads``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        pattern: str = "*.jsonl",
        *,
        bounded: bool = True,
        parse: Callable[[bytes], Any] | None = None,
        records_per_s: float | None = None,
    ) -> None:
        self.directory = str(directory)
        self.pattern = pattern
        self.bounded = bounded
        self.parse = parse
        self.records_per_s = records_per_s

    def splits(self) -> list[str]:
        d = Path(self.directory)
        if not d.is_dir():
            raise JobGraphError(f"FileSource directory {self.directory} does not exist")
        return sorted(p.name for p in d.glob(self.pattern) if p.is_file())

    def reader(self, split: str, position: dict[str, Any] | None) -> SplitReader:
        pos = position or {}
        return _FileReader(
            Path(self.directory) / split, int(pos.get("offset", 0)), int(pos.get("byte", 0)),
            self.bounded, self.parse or json.loads,
        )


class _FileReader(SplitReader):
    def __init__(self, path: Path, offset: int, byte: int, bounded: bool, parse: Callable[[bytes], Any]) -> None:
        self.path, self.offset, self.byte, self.bounded, self.parse = path, offset, byte, bounded, parse
        self.f = open(path, "rb")  # noqa: SIM115 - kept open while the split is read
        size = os.fstat(self.f.fileno()).st_size
        if byte > size:
            raise JobGraphError(
                f"{path}: the restored position (byte {byte}) is past the end of the file ({size} bytes); "
                "source files must be append-only"
            )
        self.f.seek(byte)

    def read(self, max_records: int) -> list[Any]:
        out: list[Any] = []
        f, parse = self.f, self.parse
        while len(out) < max_records:
            line = f.readline()
            if not line:
                if self.bounded:
                    self.finished = True
                break
            if not line.endswith(b"\n"):
                if not self.bounded:  # a line being appended: read it again later
                    f.seek(self.byte)
                    break
                self.finished = True
            self.byte += len(line)
            self.offset += 1
            body = line.rstrip(b"\r\n")
            if body:
                out.append(parse(body))
            if self.finished:
                break
        return out

    def position(self) -> dict[str, Any]:
        return {"offset": self.offset, "byte": self.byte}

    def close(self) -> None:
        self.f.close()


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
