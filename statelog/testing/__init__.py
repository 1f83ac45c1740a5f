"""Helpers for testing jobs that use statelog: a store that fails on demand.

:class:`FaultInjectingStore` wraps any object store and injects failures, latency, crashes
and corrupt reads, per operation and key prefix; :data:`OUTAGES` names the ways a real
store fails that are not the data's fault. Pass the wrapper as ``store=`` to
:class:`statelog.StateJob` (or ``statelog.open``). Usage: ``docs/testing.md``; the
details: :mod:`statelog.testing.faulty_store`.
"""

from statelog.testing.faulty_store import (
    OUTAGES,
    ErrorSpec,
    FaultInjectingStore,
    Hook,
    connection_error,
    permission_error,
    server_error,
    timeout_error,
)

__all__ = [
    "OUTAGES",
    "ErrorSpec",
    "FaultInjectingStore",
    "Hook",
    "connection_error",
    "permission_error",
    "server_error",
    "timeout_error",
]
