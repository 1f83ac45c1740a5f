"""statelog: changelog-based incremental state storage for stateful stream processing.

Start with :func:`statelog.open` (a :class:`~statelog.job.StateJob`), create keyed backends
from it and declare state with the descriptors exported here.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

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
from statelog.job import StateJob, open_job
from statelog.keys.encoding import register_key_type
from statelog.keys.groups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupRange,
    key_group_of,
    key_group_range_for_subtask,
    subtask_for_key_group,
)
from statelog.state.backend import KeyedStateBackend
from statelog.state.snapshot import PendingSnapshot
from statelog.types import PICKLE

open = open_job  # noqa: A001 - the natural name: statelog.open(root)

try:
    __version__ = _version("statelog")  # the installed distribution's (pyproject.toml)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "PICKLE",
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "CheckpointMetadata",
    "KeyGroupRange",
    "KeyedStateBackend",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "PendingSnapshot",
    "ReducingStateDescriptor",
    "StateJob",
    "StatelogError",
    "SubtaskStateHandle",
    "TtlConfig",
    "TtlUpdate",
    "ValueStateDescriptor",
    "key_group_of",
    "key_group_range_for_subtask",
    "open",
    "open_job",
    "register_key_type",
    "subtask_for_key_group",
]
