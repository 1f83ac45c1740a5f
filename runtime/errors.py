"""Errors of the streaming runtime (all are :class:`statelog.StatelogError`)."""

from __future__ import annotations

from statelog.errors import ConfigError, StatelogError


class RuntimeJobError(StatelogError):
    """Base class of the runtime's errors."""


class JobGraphError(RuntimeJobError, ConfigError):
    """The job graph is invalid (missing or duplicate uid, wrong operator use)."""


class NonRestoredStateError(RuntimeJobError, ConfigError):
    """The restored checkpoint holds state of an operator the job does not have."""


class JobFailedError(RuntimeJobError):
    """The job failed and its restart strategy allows no further restart."""


class JobCancelledError(RuntimeJobError):
    """The job was cancelled through its client."""


class CheckpointFailureLimitError(RuntimeJobError):
    """More checkpoints failed in a row than ``tolerable_failed_checkpoints`` allows."""


class WorkerLostError(RuntimeJobError):
    """A worker process died or closed its control connection."""


class TaskFailedError(RuntimeJobError):
    """A task raised an exception in a worker (the message holds the remote traceback)."""


class ChannelError(RuntimeJobError):
    """A data channel to or from another worker broke (usually: that worker died)."""


class PeerAuthenticationError(RuntimeJobError):
    """A peer did not prove knowledge of the job secret (the message never holds the secret)."""
