"""The job root's catalog: the job descriptor and the checkpoint metadata objects.

``job.json`` (job id, max_parallelism; write-once) and ``checkpoints/chk-<id>.json`` (one
metadata object per completed checkpoint); their keys are built and parsed by
:mod:`statelog.layout` (``docs/format.md`` section 1).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from statelog import envelope
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptionError,
    JobDescriptorMissingError,
    JobMismatchError,
    JobNotFoundError,
    ObjectExistsError,
    ObjectNotFoundError,
    SavepointNotFoundError,
)
from statelog.keys.groups import DEFAULT_MAX_PARALLELISM, check_max_parallelism
from statelog.layout import (
    CHECKPOINT_PREFIX,
    JOB_KEY,
    MATERIALIZATIONS_PREFIX,
    SAVEPOINT_PREFIX,
    check_savepoint_name,
    checkpoint_key,
    parse_checkpoint_key,
    parse_savepoint_metadata_key,
    savepoint_metadata_key,
)
from statelog.store.base import ObjectStore

log = logging.getLogger(__name__)

JOB_FORMAT = "statelog.job"
JOB_VERSION = 1

@dataclass(frozen=True)
class JobInfo:
    job_id: str
    max_parallelism: int
    created_ms: int

    def to_bytes(self) -> bytes:
        body = {
            "format": JOB_FORMAT,
            "version": JOB_VERSION,
            "job_id": self.job_id,
            "max_parallelism": self.max_parallelism,
            "created_ms": self.created_ms,
        }
        return envelope.dump(body, spaced=True)

    @staticmethod
    def from_bytes(data: bytes, key: str) -> JobInfo:
        body = envelope.load(data, key, "job descriptor", fmt=JOB_FORMAT, versions=(JOB_VERSION,))
        try:
            return JobInfo(str(body["job_id"]), int(body["max_parallelism"]), int(body["created_ms"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"job descriptor {key} is malformed: {e}", key=key) from None


RETENTION_HINT = (
    "a job keeps only its newest retain_checkpoints checkpoints (default 5) and deletes the "
    "metadata of older ones; to keep more, pass retain_checkpoints=N to statelog.open / "
    "StreamExecutionEnvironment, or keep one for good with a savepoint "
    "(`statelog savepoint create ROOT --checkpoint ID --name NAME`)"
)


def missing_checkpoint_message(checkpoint_id: int, ids: list[int], url: str) -> str:
    """Why checkpoint ``checkpoint_id`` is not among the retained ``ids`` of the root at ``url``."""
    shown = ", ".join(map(str, ids[-20:])) or "none"
    if len(ids) > 20:
        shown = f"{len(ids)} in all, the newest: {shown}"
    retained = f"retained checkpoints: {shown}"
    if ids and checkpoint_id < ids[0]:
        return (
            f"checkpoint {checkpoint_id} does not exist in {url} any more: it is older than the "
            f"oldest retained checkpoint, so retention removed it (no metadata object "
            f"{checkpoint_key(checkpoint_id)}; {retained}). {RETENTION_HINT[0].upper()}{RETENTION_HINT[1:]}"
        )
    return (
        f"checkpoint {checkpoint_id} does not exist in {url}: no metadata object "
        f"{checkpoint_key(checkpoint_id)} ({retained}); pick one of those, e.g. with "
        "`statelog checkpoints list ROOT`"
    )


class JobCatalog:
    """Reads and writes the job descriptor and checkpoint metadata of one job root."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def read_job(self) -> JobInfo | None:
        try:
            return JobInfo.from_bytes(self.store.get(JOB_KEY), JOB_KEY)
        except ObjectNotFoundError:
            return None

    def open_job(
        self, max_parallelism: int | None, create: bool = True, *, recover: bool = False
    ) -> JobInfo:
        """Read the job descriptor, creating it if absent; check ``max_parallelism``.

        A descriptor is created only on a root that holds no checkpoint, materialization or
        savepoint: on such a root it was lost, and a new one (a new job id) would disown
        them, so this raises :class:`JobDescriptorMissingError`. ``recover=True`` rebuilds
        it instead from the newest checkpoint (or savepoint) metadata: :meth:`recover_job`.
        """
        if max_parallelism is not None:
            check_max_parallelism(max_parallelism)
        info = self.read_job()
        if info is None:
            found = self.job_objects()
            if found is not None and recover:
                info = self.recover_job()
            elif found is not None:
                raise JobDescriptorMissingError(
                    f"{self.store.url} has no job descriptor {JOB_KEY} but holds {found}: the "
                    f"descriptor was lost or deleted, and a new one (a new job id) would disown that "
                    f"state, so none is created. Put the original {JOB_KEY} back (from a backup or "
                    f"copy), or rebuild it from the newest checkpoint with "
                    f"statelog.open(ROOT, recover_descriptor=True)"
                )
        if info is None:
            if not create:
                raise JobNotFoundError(
                    f"{self.store.url} is not a statelog job root (no {JOB_KEY}); check the URL"
                )
            info = JobInfo(
                job_id=uuid.uuid4().hex,
                max_parallelism=max_parallelism or DEFAULT_MAX_PARALLELISM,
                created_ms=int(time.time() * 1000),
            )
            try:
                self.store.put(JOB_KEY, info.to_bytes())
                log.info("created job %s at %s (max_parallelism=%d)", info.job_id, self.store.url, info.max_parallelism)
            except ObjectExistsError:
                info = self.read_job()  # another process created it first
                assert info is not None
        if max_parallelism is not None and info.max_parallelism != max_parallelism:
            raise JobMismatchError(
                f"the job at {self.store.url} was created with max_parallelism={info.max_parallelism}, "
                f"but {max_parallelism} was requested; max_parallelism is fixed for the life of a job "
                f"(omit it or pass {info.max_parallelism})"
            )
        return info

    def job_objects(self) -> str | None:
        """The first object that shows the root held a job (a checkpoint, materialization or
        savepoint), described for an error; ``None`` on a root without any."""
        for prefix, what in (
            (CHECKPOINT_PREFIX, "checkpoints"),
            (MATERIALIZATIONS_PREFIX, "materializations"),
            (SAVEPOINT_PREFIX, "savepoints"),
        ):
            first = next(iter(self.store.list(prefix)), None)
            if first is not None:
                return f"{what} (e.g. {first.key})"
        return None

    def recover_job(self) -> JobInfo:
        """Rebuild a lost ``job.json`` from the newest checkpoint (else savepoint) metadata:
        its job id and max_parallelism. Write-once: a descriptor that appeared meanwhile wins."""
        ids = self.checkpoint_ids()
        if ids:
            meta = self.load(ids[-1])
        else:
            names = savepoint_names(self.store)
            if not names:
                raise JobDescriptorMissingError(
                    f"{self.store.url} has no job descriptor {JOB_KEY} and no checkpoint or savepoint "
                    f"metadata to rebuild it from (only {self.job_objects()}); put the original "
                    f"{JOB_KEY} back from a backup, or start the job on a new, empty root"
                )
            newest = max((load_savepoint(self.store, n) for n in names), key=lambda m: m.timestamp_ms)
            meta = newest
        info = JobInfo(meta.job_id, meta.max_parallelism, int(time.time() * 1000))
        try:
            self.store.put(JOB_KEY, info.to_bytes())
        except ObjectExistsError:
            existing = self.read_job()
            assert existing is not None
            return existing
        log.warning(
            "rebuilt the lost job descriptor %s of %s from %s %d: job %s, max_parallelism %d",
            JOB_KEY, self.store.url, meta.kind, meta.checkpoint_id, info.job_id, info.max_parallelism,
        )
        return info

    def checkpoint_ids(self) -> list[int]:
        ids = []
        for obj in self.store.list(CHECKPOINT_PREFIX):
            cid = parse_checkpoint_key(obj.key)
            if cid is not None:
                ids.append(cid)
        return sorted(ids)

    def load(self, checkpoint_id: int) -> CheckpointMetadata:
        key = checkpoint_key(checkpoint_id)
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            raise CheckpointNotFoundError(
                missing_checkpoint_message(checkpoint_id, self.checkpoint_ids(), self.store.url)
            ) from None
        meta = CheckpointMetadata.from_bytes(data, key)
        if meta.checkpoint_id != checkpoint_id:
            raise CorruptionError(
                f"checkpoint metadata {key} holds checkpoint {meta.checkpoint_id}, expected {checkpoint_id}: "
                "another checkpoint's metadata was copied there; run `statelog verify ROOT` and restore "
                "another checkpoint",
                key=key,
            )
        if meta.kind != "checkpoint":
            raise CorruptionError(
                f"checkpoint metadata {key} is the metadata of a {meta.kind} "
                f"({meta.savepoint or 'unnamed'}), expected a checkpoint's: it was copied there; run "
                "`statelog verify ROOT` and restore another checkpoint",
                key=key,
            )
        return meta

    def latest(self) -> CheckpointMetadata | None:
        ids = self.checkpoint_ids()
        return self.load(ids[-1]) if ids else None

    def publish(self, meta: CheckpointMetadata) -> int:
        """Write the metadata object (the checkpoint exists from this moment). Returns its size."""
        data = meta.to_bytes()
        self.store.put(checkpoint_key(meta.checkpoint_id), data)
        return len(data)

    def delete(self, checkpoint_id: int) -> None:
        self.store.delete(checkpoint_key(checkpoint_id))

    def apply_retention(self, keep_last: int) -> list[int]:
        """Delete the metadata of all but the newest ``keep_last`` checkpoints."""
        ids = self.checkpoint_ids()
        doomed = ids[:-keep_last] if keep_last > 0 else []
        for cid in doomed:
            self.delete(cid)
        if doomed:
            log.info("retention: removed checkpoint metadata %s", doomed)
        return doomed


def parse_checkpoint_id(value: Any) -> int:
    """Parse a user-given checkpoint id, with a clear error for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise ConfigError(f"a checkpoint id is a non-negative integer, got {value!r}")


def savepoint_names(store: ObjectStore) -> list[str]:
    """Names of the savepoints of a job root (those whose metadata object exists)."""
    out = []
    for obj in store.list(SAVEPOINT_PREFIX):
        name = parse_savepoint_metadata_key(obj.key)
        if name is not None:
            out.append(name)
    return sorted(out)


def load_savepoint(store: ObjectStore, name: str) -> CheckpointMetadata:
    """The metadata of savepoint ``name``; a clear error listing the savepoints if absent."""
    key = savepoint_metadata_key(check_savepoint_name(name))
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        names = savepoint_names(store)
        raise SavepointNotFoundError(
            f"savepoint {name!r} does not exist in {store.url}: no metadata object {key} "
            f"(savepoints: {', '.join(names) or 'none'}); "
            "list them with `statelog savepoint list ROOT`"
        ) from None
    meta = CheckpointMetadata.from_bytes(data, key)
    if meta.kind != "savepoint":
        raise CorruptionError(
            f"{key} is not savepoint metadata (kind {meta.kind!r}, checkpoint {meta.checkpoint_id}): a "
            f"checkpoint's metadata was copied there; delete the savepoint with `statelog savepoint delete "
            f"ROOT {name}`",
            key=key,
        )
    if meta.savepoint is not None and meta.savepoint != name:
        raise CorruptionError(
            f"savepoint metadata {key} is the metadata of savepoint {meta.savepoint!r}, expected {name!r}: "
            f"it was copied there; restore savepoint {meta.savepoint!r} itself, and delete this one with "
            f"`statelog savepoint delete ROOT {name}`",
            key=key,
        )
    return meta
