"""Sinks: an exactly-once file sink (two-phase commit), a collect sink and a print sink.

**FileSink** writes JSON lines below its directory. Each sink subtask writes the records
of one transaction into an in-progress file; on barrier ``n`` it flushes, fsyncs and
renames it to ``.pending/<n>-<subtask>-<tag>.jsonl`` (pre-commit, before acknowledging the
checkpoint); when checkpoint ``n`` completes it renames every own pending file of a
checkpoint ``<= n`` to ``part-<n>-<subtask>-<tag>.jsonl`` (commit). After a failure the job
master, before redeploying, commits every pending file of a checkpoint ``<=`` the restored
one (their checkpoint completed, the notification may have been lost) and deletes all other
pending and in-progress files (their records will be produced again). Commit is a rename of
a deterministic name, so it is idempotent. ``<tag>`` names the run and attempt, so names
never collide across attempts. Readers take ``part-*`` files only (:func:`read_committed`).
On a store URL (``s3://bucket/prefix``, ``file://``) the same protocol runs on objects:
:mod:`runtime.connectors.object_sink`.

**CollectSink** hands each transaction to the coordinator with the checkpoint (as
"committables"); the job master releases them into ``JobResult.collected[uid]`` when a
checkpoint ``>=`` theirs completes, and drops them on failover: exactly once as well.

**PrintSink** writes each record when it arrives (at-least-once: replays repeat output).

All three take Arrow record batches too (``from_source(..., batches=True)``): a batch
stands for its rows, as ``{column: value}`` dicts (a JSON line, a collected record, a
printed line per row).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from runtime.connectors.object_sink import (
    ObjectSinkOperator,
    committed_objects,
    read_committed_objects,
    recover_objects,
    sink_store_options,
)
from runtime.connectors.two_phase import TwoPhaseCommitOperator, commits_on_recovery
from runtime.errors import JobGraphError
from runtime.task.operators import OperatorSnapshot, StreamOperator
from statelog.store import open_store, redact_url

PENDING_DIR = ".pending"
INPROGRESS_DIR = ".inprogress"
_PENDING_RE = re.compile(r"^(\d{10})-(\d{4})-([A-Za-z0-9_-]+)\.jsonl$")


class Sink:
    """Base of sinks: creates the runtime operator; the job master recovers it on restart."""

    def create_operator(self, uid: str) -> StreamOperator:
        raise NotImplementedError

    def recover(self, committed_upto: int | None) -> None:
        """Before (re)deploying: commit what belongs to checkpoints ``<= committed_upto``,
        abort the rest."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_serializer(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class FileSink(Sink):
    """Exactly-once JSON lines files below ``directory`` (see the module docstring).

    ``directory`` may be a store URL, ``s3://bucket/prefix`` or ``file:///abs/path``: the
    same protocol on objects through statelog's store layer (:mod:`runtime.connectors.object_sink`), so
    every node of a cluster reaches the output; ``store_options`` then configures the store
    (else the ``AWS_*`` environment of the process that builds the sink: resolved here, they
    travel with the pickled sink, never shown by its ``repr``).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        serializer: Callable[[Any], str] | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise JobGraphError(f"FileSink needs a directory path or an s3:// URL, got {directory!r}")
        if serializer is not None and not callable(serializer):
            raise JobGraphError(f"FileSink serializer must be a callable value -> str or None, got {serializer!r}")
        self.directory = str(directory)
        self.serializer = serializer
        self.store_options = sink_store_options("FileSink", self.directory, store_options)

    def __repr__(self) -> str:
        if not self.store_options:
            return f"FileSink({redact_url(self.directory)!r})"
        return f"FileSink({redact_url(self.directory)!r}, store_options={self.store_options!r})"

    def create_operator(self, uid: str) -> StreamOperator:
        serializer = self.serializer or _default_serializer
        if self.store_options is not None:
            return ObjectSinkOperator(uid, self.directory, self.store_options, serializer)
        return FileSinkOperator(uid, Path(self.directory), serializer)

    def recover(self, committed_upto: int | None) -> None:
        if self.store_options is not None:
            with open_store(self.directory, self.store_options) as store:
                recover_objects(store, committed_upto)
            return
        d = Path(self.directory)
        pending = d / PENDING_DIR
        if pending.is_dir():
            for p in sorted(pending.iterdir()):
                m = _PENDING_RE.match(p.name)
                if commits_on_recovery(int(m.group(1)) if m else None, committed_upto):
                    commit_pending(d, p.name)
                else:
                    p.unlink(missing_ok=True)
            _fsync_dir(pending)
        inprogress = d / INPROGRESS_DIR
        if inprogress.is_dir():
            for p in inprogress.iterdir():
                p.unlink(missing_ok=True)


def commit_pending(directory: Path, name: str) -> None:
    """Commit one pending file (idempotent: a committed file is left as it is)."""
    src = directory / PENDING_DIR / name
    dst = directory / f"part-{name}"
    try:
        os.replace(src, dst)
    except FileNotFoundError:
        if not dst.exists():
            raise
        return
    _fsync_dir(directory)


def committed_files(
    directory: str | os.PathLike[str], upto_checkpoint: int | None = None, store_options: Mapping[str, Any] | None = None
) -> list[Path] | list[str]:
    """The committed files of a file sink, in checkpoint order (optionally ``<=`` a checkpoint).

    For a store URL (``s3://``, ``file://``) the committed objects' URLs.
    """
    url = str(directory)
    options = sink_store_options("committed_files", url, store_options)
    if options is not None:
        with open_store(url, options) as store:
            return [f"{url.rstrip('/')}/{key}" for key in committed_objects(store, upto_checkpoint)]
    out = []
    d = Path(directory)
    if not d.is_dir():
        return []
    for p in sorted(d.glob("part-*.jsonl")):
        m = _PENDING_RE.match(p.name[len("part-"):])
        if m and (upto_checkpoint is None or int(m.group(1)) <= upto_checkpoint):
            out.append(p)
    return out


def read_committed(
    directory: str | os.PathLike[str], upto_checkpoint: int | None = None, store_options: Mapping[str, Any] | None = None
) -> list[Any]:
    """The records of the committed files (JSON lines), optionally up to a checkpoint; a store
    URL (``s3://``, ``file://``) with its ``store_options`` reads the committed objects."""
    url = str(directory)
    options = sink_store_options("read_committed", url, store_options)
    if options is not None:
        with open_store(url, options) as store:
            return list(read_committed_objects(store, upto_checkpoint))
    out = []
    for p in committed_files(directory, upto_checkpoint):
        with open(p, "rb") as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out


class FileSinkOperator(TwoPhaseCommitOperator):
    """A transaction is an in-progress file, pre-committed by a rename into ``.pending``."""

    def __init__(self, uid: str, directory: Path, serializer: Callable[[Any], str]) -> None:
        super().__init__(uid, serializer)
        self.directory = directory
        self._file: IO[str] | None = None
        self._path: Path | None = None
        self._seq = 0

    def open(self) -> None:
        (self.directory / PENDING_DIR).mkdir(parents=True, exist_ok=True)
        (self.directory / INPROGRESS_DIR).mkdir(parents=True, exist_ok=True)
        super().open()

    def write_line(self, line: str) -> None:
        f = self._file
        if f is None:
            self._seq += 1
            self._path = self.directory / INPROGRESS_DIR / f"{self.ctx.subtask:04d}-{self.tag}-{self._seq}.jsonl"
            f = self._file = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 - one per transaction
        f.write(line)
        f.write("\n")

    def pre_commit(self, checkpoint_id: int) -> list[str]:
        f = self._file
        if f is None:
            return []
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None
        name = f"{checkpoint_id:010d}-{self.ctx.subtask:04d}-{self.tag}.jsonl"
        assert self._path is not None
        os.replace(self._path, self.directory / PENDING_DIR / name)
        _fsync_dir(self.directory / PENDING_DIR)
        return [name]

    def commit(self, name: str) -> None:
        commit_pending(self.directory, name)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class CollectSink(Sink):
    """Collects records into ``JobResult.collected[uid]``, exactly once (see module doc)."""

    def create_operator(self, uid: str) -> StreamOperator:
        return CollectSinkOperator(uid)


class CollectSinkOperator(StreamOperator):
    name = "collect-sink"

    def open(self) -> None:
        self._buf: list[Any] = []

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        if type(value) is pa.RecordBatch:
            self._buf.extend(value.to_pylist())  # its rows, as {column: value} dicts
            return
        self._buf.append(value)

    def snapshot(self, checkpoint_id: int) -> OperatorSnapshot | None:
        buf, self._buf = self._buf, []
        return OperatorSnapshot(committables=buf)


class PrintSink(Sink):
    """Writes ``prefix + repr(value)`` lines to ``stream`` (default stdout) as records arrive."""

    def __init__(self, prefix: str = "", stream: IO[str] | None = None) -> None:
        self.prefix = prefix
        self.stream = stream

    def create_operator(self, uid: str) -> StreamOperator:
        return PrintSinkOperator(uid, self.prefix, self.stream)

    def __getstate__(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "stream": None}


class PrintSinkOperator(StreamOperator):
    name = "print-sink"

    def __init__(self, uid: str, prefix: str, stream: IO[str] | None) -> None:
        super().__init__(uid)
        self.prefix = prefix
        self.stream = stream

    def process(self, value: Any, ts: int | None, input_index: int) -> None:
        stream = self.stream or sys.stdout
        for v in value.to_pylist() if type(value) is pa.RecordBatch else (value,):
            stream.write(f"{self.prefix}{v!r}\n")
