"""The exactly-once file sink on an object store (``s3://bucket/prefix``, ``file://`` URLs).

The same two-phase commit as the local :class:`runtime.connectors.sinks.FileSink`, adapted to a store
without rename, through statelog's store layer (:func:`statelog.store.open_store`):

* **write**: a sink subtask appends the JSON lines of one transaction to a local spool file
  (an anonymous temporary file: bounded memory, nothing left behind by a SIGKILL);
* **pre-commit** (barrier ``n``, before the ack): the spool is put as the pending object(s)
  ``.pending/<n>-<subtask>-<tag>-<chunk>.jsonl``, at most :data:`CHUNK_BYTES` each, cut at
  line ends (so no more than one chunk is ever in memory); ``put`` is durable on return;
* **commit** (checkpoint ``m >= n`` completed): each pending object is read and put under
  ``part-<n>-<subtask>-<tag>-<chunk>.jsonl`` (the store has no copy), then the pending one
  deleted. The name is deterministic and ``put`` of identical bytes is a no-op, so a commit
  interrupted anywhere is completed by running it again;
* **recovery** (before an attempt, restored from ``r``): every pending object of a
  checkpoint ``<= r`` is committed, every other one deleted.

Why this is exactly once is the argument of the local sink (``docs/runtime.md``, *Sinks*);
the object layout is ``docs/format.md`` section 11. The store options (endpoint, region,
credentials) are resolved where the sink is built (``AWS_*`` of that process included) and
travel with the pickled sink inside a :class:`~statelog.store.options.StoreOptions`, whose
renderings hide the secrets.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from runtime.connectors.two_phase import TwoPhaseCommitOperator, commits_on_recovery
from runtime.errors import JobGraphError
from statelog.errors import ObjectNotFoundError, StatelogError
from statelog.store import open_store, redact_url
from statelog.store.base import ObjectStore
from statelog.store.options import StoreOptions, resolve_store_options

URL_SCHEMES = ("s3://", "file://")
PENDING_PREFIX = ".pending/"
PART_PREFIX = "part-"
CHUNK_BYTES = 64 << 20
# <checkpoint:010d>-<subtask:04d>-<tag>-<chunk:04d>.jsonl; the tag is <run id[:8]>-a<attempt>
OBJECT_RE = re.compile(r"^(\d{10})-(\d{4})-([A-Za-z0-9_]+-a\d+)-(\d{4})\.jsonl$")


def is_store_url(target: str) -> bool:
    """Whether a sink target is a store URL (else a plain local directory)."""
    return target.lower().startswith(URL_SCHEMES)


def sink_store_options(kind: str, target: str, options: Mapping[str, Any] | None) -> StoreOptions | None:
    """The resolved store options of a sink URL (``None`` for a local directory).

    Checks the URL and options the way :func:`open_store` does (no network call) and turns
    its :class:`~statelog.errors.ConfigError` into a :class:`JobGraphError`, at job
    construction rather than in a worker.
    """
    if not is_store_url(target):
        if "://" in target:
            raise JobGraphError(
                f"{kind} {redact_url(target)!r}: unsupported URL scheme; pass a local directory, "
                "an s3://bucket/prefix or a file:///absolute/path URL"
            )
        if options:
            raise JobGraphError(
                f"{kind} store_options apply to s3:// (or file://) URLs only, not to the local directory "
                f"{target!r}; drop store_options or pass an s3://bucket/prefix URL"
            )
        return None
    try:
        resolved = resolve_store_options(target, options)
        open_store(target, resolved).close()
    except StatelogError as exc:
        raise JobGraphError(f"{kind} {redact_url(target)!r}: {exc}") from None
    return resolved


def object_name(checkpoint_id: int, subtask: int, tag: str, chunk: int) -> str:
    return f"{checkpoint_id:010d}-{subtask:04d}-{tag}-{chunk:04d}.jsonl"


def parse_name(name: str) -> int | None:
    """The checkpoint id of a pending object's name (without prefix), ``None`` if foreign."""
    m = OBJECT_RE.match(name)
    return int(m.group(1)) if m else None


def commit_pending_object(store: ObjectStore, name: str) -> None:
    """Commit one pending object (idempotent: a committed one is left as it is)."""
    pending = PENDING_PREFIX + name
    try:
        data = store.get(pending)
    except ObjectNotFoundError:  # committed (and deleted) before
        if store.head(PART_PREFIX + name) is None:
            raise
        return
    store.put(PART_PREFIX + name, data)  # identical bytes: a no-op on a repeated commit
    store.delete(pending)


def recover_objects(store: ObjectStore, committed_upto: int | None) -> tuple[int, int]:
    """Commit the pending objects of checkpoints ``<= committed_upto``, delete the others;
    returns ``(committed, deleted)``."""
    committed = deleted = 0
    for info in list(store.list(PENDING_PREFIX)):
        name = info.key[len(PENDING_PREFIX):]
        cid = parse_name(name)
        if commits_on_recovery(cid, committed_upto):
            commit_pending_object(store, name)
            committed += 1
        else:
            store.delete(info.key)
            deleted += 1
    return committed, deleted


def committed_objects(store: ObjectStore, upto_checkpoint: int | None = None) -> list[str]:
    """The keys of the committed objects, in checkpoint order (optionally ``<=`` a checkpoint)."""
    out = []
    for info in store.list(PART_PREFIX):
        cid = parse_name(info.key[len(PART_PREFIX):])
        if cid is not None and "/" not in info.key and (upto_checkpoint is None or cid <= upto_checkpoint):
            out.append(info.key)
    return sorted(out)


def read_committed_objects(store: ObjectStore, upto_checkpoint: int | None = None) -> Iterator[Any]:
    for key in committed_objects(store, upto_checkpoint):
        data = store.get(key)
        for n, line in enumerate(data.splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{store.url}/{key} line {n} is not JSON: {exc}") from None


def chunks(spool: IO[bytes], limit: int) -> Iterator[bytes]:
    """The spool's bytes in pieces of at most ``limit`` bytes cut at line ends (a longer line
    is a piece of its own), never more than one piece in memory."""
    spool.seek(0)
    buf: list[bytes] = []
    size = 0
    for line in spool:
        if buf and size + len(line) > limit:
            yield b"".join(buf)
            buf, size = [], 0
        buf.append(line)
        size += len(line)
    if buf:
        yield b"".join(buf)


class ObjectSinkOperator(TwoPhaseCommitOperator):
    """A transaction is a local spool file, pre-committed as pending objects."""

    def __init__(
        self, uid: str, url: str, options: StoreOptions, serializer: Callable[[Any], str], chunk_bytes: int = CHUNK_BYTES
    ) -> None:
        super().__init__(uid, serializer)
        self.url = url
        self.options = options
        self.chunk_bytes = chunk_bytes
        self._spool: IO[bytes] | None = None

    def open(self) -> None:
        self.store = open_store(self.url, self.options)
        super().open()

    def write_line(self, line: str) -> None:
        f = self._spool
        if f is None:
            f = self._spool = tempfile.TemporaryFile(prefix="statelog-sink-")  # noqa: SIM115 - one per transaction
        f.write(line.encode("utf-8"))
        f.write(b"\n")

    def pre_commit(self, checkpoint_id: int) -> list[str]:
        f, self._spool = self._spool, None
        names: list[str] = []
        if f is not None:
            with f:
                for i, data in enumerate(chunks(f, self.chunk_bytes)):
                    name = object_name(checkpoint_id, self.ctx.subtask, self.tag, i)
                    self.store.put(PENDING_PREFIX + name, data)
                    names.append(name)
        return names

    def commit(self, name: str) -> None:
        commit_pending_object(self.store, name)

    def close(self) -> None:
        if self._spool is not None:
            with contextlib.suppress(OSError):
                self._spool.close()
            self._spool = None
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
