"""A source of JSON lines files: one split per file of a directory.

Position ``{"offset": records read, "byte": byte offset}``: files are append-only, a
restore seeks to the byte offset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.connectors.sources import Source, SplitReader
from runtime.errors import JobGraphError


class FileSource(Source):
    """JSON lines files of a directory, one split per file.

    ``pattern``: a glob that names the files to read within ``directory`` (default
    ``"*.jsonl"``; e.g. ``"*.json"``, ``"clicks-*.jsonl"``, ``"*"``). A directory in which no
    file matches is a :class:`~runtime.errors.JobGraphError` when the job starts (naming the
    directory, the pattern and files that are there), never a source that reads nothing.

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
        if not isinstance(pattern, str) or not pattern:
            raise JobGraphError(
                f"FileSource pattern must be a non-empty glob such as '*.jsonl' or '*.json', got {pattern!r}"
            )
        self.directory = str(directory)
        self.pattern = pattern
        self.bounded = bounded
        self.parse = parse
        self.records_per_s = records_per_s

    def splits(self) -> list[str]:
        d = Path(self.directory)
        if not d.is_dir():
            raise JobGraphError(f"FileSource directory {self.directory} does not exist")
        names = sorted(p.name for p in d.glob(self.pattern) if p.is_file())
        if not names:
            others = sorted(p.name for p in d.iterdir() if p.is_file())
            there = f"files there: {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}" if others \
                else "the directory has no files"
            raise JobGraphError(
                f"FileSource: no file in {self.directory} matches the pattern {self.pattern!r} ({there}); "
                "pass pattern= matching your files (e.g. FileSource(directory, pattern='*.json')) "
                "or put the input files there before the job starts"
            )
        return names

    def check(self) -> None:
        self.splits()

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
