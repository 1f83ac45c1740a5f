"""Exception hierarchy of statelog.

Every error says what was expected, what was found and what to do. Messages never
contain secrets (credentials are redacted before they reach an exception).
"""

from __future__ import annotations


class StatelogError(Exception):
    """Base class of every error raised by statelog."""


class ConfigError(StatelogError, ValueError):
    """A configuration value, URL or option is malformed or inconsistent."""


class StoreError(StatelogError):
    """An object-store operation failed: the store, not the data, is at fault.

    Readers raise it (never :class:`CorruptionError`) when a store is unreachable or fails;
    ``retryable`` says whether the same call may succeed later.
    """

    retryable = False

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class TransientStoreError(StoreError):
    """A store call failed in a way that may succeed when retried (timeouts, 5xx, resets)."""

    retryable = True


class ObjectNotFoundError(StoreError):
    """The named object does not exist."""


class ObjectExistsError(StoreError):
    """A write-once put found a different object already stored under the key."""


class BucketNotFoundError(StoreError):
    """The S3 bucket named in the job root does not exist."""


class AuthenticationError(StoreError):
    """The store refused the credentials (wrong access key or secret)."""


class CorruptionError(StatelogError):
    """Bytes read back fail verification (checksum, magic, length or format).

    The message always names the object; state is never produced from corrupt bytes.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class FormatVersionError(CorruptionError):
    """An object was written in a format version this build cannot read."""


class SerializationError(StatelogError, TypeError):
    """A key or value cannot be serialized with the declared type."""


class StateTypeError(SerializationError):
    """A value does not match the Arrow type declared by its state descriptor."""


class JobMismatchError(StatelogError):
    """The job root was created with different fixed settings (e.g. max_parallelism)."""


class JobNotFoundError(StatelogError, LookupError):
    """The root URL does not hold a statelog job (no job descriptor)."""


class CheckpointNotFoundError(StatelogError, LookupError):
    """The requested checkpoint id does not exist (or is no longer retained)."""


class SavepointNotFoundError(StatelogError, LookupError):
    """The requested savepoint does not exist."""


class CheckpointAbortedError(StatelogError):
    """A checkpoint was cancelled or failed before it completed."""


class WriterFailedError(StatelogError):
    """The changelog writer failed permanently; the task must restart from a checkpoint."""


class KeyGroupError(StatelogError):
    """A key was set on a backend whose subtask does not own the key's key group."""


class StateNotFoundError(StatelogError, LookupError):
    """A named operator or state does not exist in the checkpoint."""


class LeaseLostError(StatelogError):
    """A leader lease is not (or no longer) held: it expired, was released, or a daemon
    acquired a higher generation. The holder must stop publishing at once."""


class FencedError(LeaseLostError):
    """This process lost its job root's writer lease (it stalled or was cut off longer than
    the ttl, and another process took the root over): final. It never restarts, restores,
    recovers or commits a sink, or writes under the root again. The message names the root,
    the new holder and what happened."""


class LeaseHeldError(StatelogError):
    """Another live process holds the lease (e.g. the writer lease of a job root): this one
    must not write. The message names the root and the holder (owner, host, pid)."""


class StorePermissionError(StoreError):
    """The store refused an operation for lack of permission (read-only directory, S3
    credentials without write access): not transient, retrying does not help."""


class JobDescriptorMissingError(JobNotFoundError):
    """The job descriptor (``job.json``) is missing from a root that holds checkpoints,
    materializations or savepoints: it was lost, and is never silently recreated."""


class RestoreRequiredError(StatelogError):
    """A job (or backend) was started without ``restore=`` on a root whose checkpoints hold
    its state: restore one, or start fresh explicitly with ``restore="none"``."""


class MissingDependencyError(StatelogError, ImportError):
    """An optional part of statelog needs a package that is not installed (e.g. PySpark for
    ``statelog.spark``); the message names the extra that installs it."""


class QueryError(StatelogError):
    """A ``statelog serve`` server refused a query or could not be reached
    (:func:`statelog.query`). The message is the server's; ``status`` is the HTTP status
    (401 token, 400 malformed request or key, 404 unknown operator, state or path, 503 no
    state to read yet), ``None`` when no answer came."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
