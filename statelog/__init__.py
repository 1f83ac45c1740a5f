"""statelog: changelog-based incremental state storage for stateful stream processing.

Start with :func:`statelog.open` (a :class:`~statelog.job.StateJob`), create keyed backends
from it and declare state with the descriptors exported here.

The names below are exported lazily (PEP 562): ``import statelog`` imports none of the
engine's modules (nor pyarrow), ``statelog.X`` and ``from statelog import X`` import the
module that defines ``X`` on first use. ``tests/architecture/test_startup_imports.py``
checks that ``import statelog`` stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statelog.checkpoint.metadata import CheckpointMetadata, SubtaskStateHandle
    from statelog.descriptors import (
        AggregateFunction,
        AggregatingStateDescriptor,
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        TtlConfig,
        TtlUpdate,
        ValueStateDescriptor,
    )
    from statelog.errors import StatelogError
    from statelog.following.follower import Follower, follow
    from statelog.job import StateJob, open_job
    from statelog.job import open_job as open  # noqa: A004 - the natural name: statelog.open(root)
    from statelog.keys.encoding import register_key_type
    from statelog.keys.groups import (
        DEFAULT_MAX_PARALLELISM,
        KeyGroupRange,
        key_group_of,
        key_group_range_for_subtask,
        subtask_for_key_group,
    )
    from statelog.query_client import QueryClient, query
    from statelog.state.backend import KeyedStateBackend
    from statelog.state.snapshot import PendingSnapshot
    from statelog.types import PICKLE

# exported name -> (module, name in that module)
_EXPORTS: dict[str, tuple[str, str]] = {
    "CheckpointMetadata": ("statelog.checkpoint.metadata", "CheckpointMetadata"),
    "SubtaskStateHandle": ("statelog.checkpoint.metadata", "SubtaskStateHandle"),
    "AggregateFunction": ("statelog.descriptors", "AggregateFunction"),
    "AggregatingStateDescriptor": ("statelog.descriptors", "AggregatingStateDescriptor"),
    "ListStateDescriptor": ("statelog.descriptors", "ListStateDescriptor"),
    "MapStateDescriptor": ("statelog.descriptors", "MapStateDescriptor"),
    "ReducingStateDescriptor": ("statelog.descriptors", "ReducingStateDescriptor"),
    "TtlConfig": ("statelog.descriptors", "TtlConfig"),
    "TtlUpdate": ("statelog.descriptors", "TtlUpdate"),
    "ValueStateDescriptor": ("statelog.descriptors", "ValueStateDescriptor"),
    "StatelogError": ("statelog.errors", "StatelogError"),
    "Follower": ("statelog.following.follower", "Follower"),
    "follow": ("statelog.following.follower", "follow"),
    "StateJob": ("statelog.job", "StateJob"),
    "open_job": ("statelog.job", "open_job"),
    "open": ("statelog.job", "open_job"),
    "register_key_type": ("statelog.keys.encoding", "register_key_type"),
    "QueryClient": ("statelog.query_client", "QueryClient"),
    "query": ("statelog.query_client", "query"),
    "DEFAULT_MAX_PARALLELISM": ("statelog.keys.groups", "DEFAULT_MAX_PARALLELISM"),
    "KeyGroupRange": ("statelog.keys.groups", "KeyGroupRange"),
    "key_group_of": ("statelog.keys.groups", "key_group_of"),
    "key_group_range_for_subtask": ("statelog.keys.groups", "key_group_range_for_subtask"),
    "subtask_for_key_group": ("statelog.keys.groups", "subtask_for_key_group"),
    "KeyedStateBackend": ("statelog.state.backend", "KeyedStateBackend"),
    "PendingSnapshot": ("statelog.state.snapshot", "PendingSnapshot"),
    "PendingCheckpoint": ("statelog.checkpoint.pending", "PendingCheckpoint"),
    "PICKLE": ("statelog.types", "PICKLE"),
}


def _distribution_version() -> str:
    """The installed distribution's version (pyproject.toml), ``0+unknown`` in a source tree."""
    metadata = import_module("importlib.metadata")  # ~15 ms: only when __version__ is read
    try:
        return str(metadata.version("statelog"))
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first use and cache the name in this module."""
    if name == "__version__":
        value: Any = _distribution_version()
    elif name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(import_module(module), attr)
    else:
        raise AttributeError(f"module 'statelog' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, "__version__"])


__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "PICKLE",
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "CheckpointMetadata",
    "Follower",
    "KeyGroupRange",
    "KeyedStateBackend",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "PendingCheckpoint",
    "PendingSnapshot",
    "QueryClient",
    "ReducingStateDescriptor",
    "StateJob",
    "StatelogError",
    "SubtaskStateHandle",
    "TtlConfig",
    "TtlUpdate",
    "ValueStateDescriptor",
    "follow",
    "key_group_of",
    "key_group_range_for_subtask",
    "open",
    "open_job",
    "query",
    "register_key_type",
    "subtask_for_key_group",
]
