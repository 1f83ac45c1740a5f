"""Giving a registered state another descriptor of the same stored state, and a changelog
stream, in place (its entries stay): used when a follower's replica becomes a writing backend
(:mod:`statelog.following.promote`)."""

from __future__ import annotations

from statelog.changelog.stream import ChangelogStream
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateInfo,
    StateKind,
    ValueStateDescriptor,
)
from statelog.errors import ConfigError
from statelog.state.keyed import KeyedState
from statelog.state.kinds import AggregatingState, ReducingState, ValueState

__all__ = ["narrow_stream", "rebind"]


def narrow_stream(info: StateInfo) -> bool:
    """The stream of a state records values only (as :meth:`KeyedStateBackend.get_state` opens it)."""
    return info.ttl is None and info.kind in (StateKind.VALUE, StateKind.REDUCING, StateKind.AGGREGATING)


def rebind(state: KeyedState, descriptor: StateDescriptor, stream: ChangelogStream | None) -> None:
    """Give ``state`` ``descriptor`` (which must describe the same stored state: name, kind,
    types and TTL) and changelog ``stream``, keeping its entries."""
    info = StateInfo.from_descriptor(descriptor)
    if info != state.info:
        raise ConfigError(
            f"state {descriptor.name!r} is stored as {state.info} but was asked for as {info}; keep the "
            "stored kind, types and TTL, or use a new state name"
        )
    state.descriptor = descriptor
    state._stream = stream
    state._narrow = stream is not None and stream.narrow
    state._append = stream.append if stream is not None else state._append
    state._buf = stream.buf if stream is not None else state._buf
    state._buf_limit = stream.normal_limit if stream is not None else state._buf_limit
    if stream is not None:
        stream.owner = state
    if isinstance(descriptor, ReducingStateDescriptor) and isinstance(state, ReducingState):
        state._reduce = descriptor.reduce_fn
    if isinstance(descriptor, AggregatingStateDescriptor) and isinstance(state, AggregatingState):
        state._agg = descriptor.aggregate
    if isinstance(state, ValueState):  # its value/update closures capture the stream and the default
        state._default = descriptor.default if isinstance(descriptor, ValueStateDescriptor) else None
        for name in ("value", "update"):
            state.__dict__.pop(name, None)
        if state._ttl:
            state.value = state._ttl_value  # type: ignore[method-assign]
            state.update = state._ttl_update  # type: ignore[method-assign]
        else:
            if not state._ctx.changelog_enabled:
                state.update = state._heap_update  # type: ignore[method-assign]
            state._install_fast_paths()
