"""The value-like state kinds (value, reducing, aggregating), and which kind each descriptor makes.

A value state's ``update`` runs once per record in most jobs, so each value state replaces
``value``/``update`` by closures bound to it; ``update`` is the C version
(``statelog/_ext/fastpath.c``) when it was built, else the pure-Python closure (the
reference implementation; ``STATELOG_PURE_PYTHON=1`` forces it). The list and map kinds are
in :mod:`statelog.state.containers`; their common part in :mod:`statelog.state.keyed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statelog import _ext
from statelog.changelog.ops import Op
from statelog.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statelog.errors import ConfigError
from statelog.state import batch
from statelog.state.containers import ListState, MapState
from statelog.state.context import KeyContext
from statelog.state.keyed import KeyedState
from statelog.types import fast_check

if TYPE_CHECKING:
    from statelog.changelog.stream import ChangelogStream

_PUT = Op.PUT.value  # written into records as a plain int (the segment encoder caches its column)
# The C version of the value-state update (statelog/_ext/fastpath.c), when it was built;
# STATELOG_PURE_PYTHON=1 forces the pure-Python closures (the reference implementation).
_FORCE_PYTHON = _ext.FORCE_PYTHON
try:
    from statelog._ext import fastpath as _fastpath
except ImportError:  # not built (e.g. no compiler): the closures below are used
    _fastpath = None


class ValueState(KeyedState):
    """One value per key and namespace."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        self._default = descriptor.default if isinstance(descriptor, ValueStateDescriptor) else None
        if self._ttl:
            self.value = self._ttl_value  # type: ignore[method-assign]
            self.update = self._ttl_update  # type: ignore[method-assign]
        elif not ctx.changelog_enabled:
            self.update = self._heap_update  # type: ignore[method-assign]
        if not self._ttl:
            self._install_fast_paths()

    def _install_fast_paths(self) -> None:
        """Replace ``value``/``update`` by closures: the per-record hot path of most jobs."""
        state, ctx, default = self, self._ctx, self._default
        stream, buf = self._stream, self._buf
        check, clear = self._check, self.clear

        def value() -> Any:
            return state._cur.get(ctx.key, default)

        self.value = value  # type: ignore[method-assign]
        fast = fast_check(self.descriptor.value_type)
        if fast is None:
            return
        pytype, lo, hi = fast
        if lo is None:
            lo, hi = -1, 1  # only consulted for ints
        if _fastpath is not None and not _FORCE_PYTHON:
            self.update = _fastpath.make_update(  # type: ignore[method-assign]
                ctx, buf if stream is not None else None, stream, pytype, lo, hi,
                check, clear, _PUT, self._nsctx,
                stream.limit_cell if stream is not None else None,
            )
            return

        if stream is None:

            def update(v: Any) -> None:
                if v.__class__ is not pytype or (pytype is int and not lo <= v <= hi):
                    if v is None:
                        clear()
                        return
                    check(v)
                state._cur[ctx.key] = v

        else:
            extend, put, limit_cell = buf.extend, _PUT, stream.limit_cell

            def update(v: Any) -> None:
                if v.__class__ is not pytype or (pytype is int and not lo <= v <= hi):
                    if v is None:
                        clear()
                        return
                    check(v)
                state._cur[ctx.key] = v
                ki = ctx.key_info
                extend((ki[1], ki[2], state._nsb, put, v))
                # the limit drops to 0 while the writer applies back-pressure
                if len(buf) >= limit_cell[0]:
                    stream.on_buffer_full()

        self.update = update  # type: ignore[method-assign]

    def value(self) -> Any:
        return self._cur.get(self._ctx.key, self._default)

    def get_many(self, keys: Any) -> pa.Array:
        """The values of ``keys`` (an Arrow array or a sequence) in the current namespace, as
        an Arrow array of the value type, the default where absent (:mod:`statelog.state.batch`)."""
        return batch.get_many(self, keys)

    def put_many(self, keys: Any, values: Any) -> None:
        """``update(value)`` of each key, in order (a ``None`` value clears its key)."""
        batch.put_many(self, keys, values)

    def delete_many(self, keys: Any) -> None:
        """``clear()`` of each key."""
        batch.delete_many(self, keys)

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        self._cur[self._ctx.key] = value
        self._emit(_PUT, None, value, None)

    def _heap_update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        self._cur[self._ctx.key] = value

    def _ttl_value(self) -> Any:
        entry = self._cur.get(self._ctx.key)
        if entry is None:
            return self._default
        now = self._now()
        if entry[1] <= now:
            del self._cur[self._ctx.key]
            return self._default
        if self._ttl_on_read:
            entry[1] = now + self._ttl
            self._emit(_PUT, None, entry[0], entry[1])
        return entry[0]

    def _ttl_update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._check(value)
        exp = self._now() + self._ttl
        self._cur[self._ctx.key] = [value, exp]
        self._emit(_PUT, None, value, exp)


class ReducingState(ValueState):
    """A value folded with the descriptor's ``reduce_fn``."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        assert isinstance(descriptor, ReducingStateDescriptor)
        self._reduce = descriptor.reduce_fn
        self._batch_reduction = batch.batch_reduction_of(descriptor.reduce_fn)

    def get(self) -> Any:
        return self.value()

    def add_many(self, keys: Any, values: Any) -> None:
        """``add(value)`` of each key, in order: vectorized when the reduce function has a
        :class:`~statelog.state.batch.BatchReduction`, else key by key."""
        batch.add_many(self, self._batch_reduction, keys, values, self.add)

    def add(self, value: Any) -> None:
        cur = self.value()
        self.update(value if cur is None else self._reduce(cur, value))  # type: ignore[misc]


class AggregatingState(ValueState):
    """An accumulator updated with the descriptor's aggregate function."""

    def __init__(
        self, ctx: KeyContext, descriptor: StateDescriptor, stream: ChangelogStream | None
    ) -> None:
        super().__init__(ctx, descriptor, stream)
        assert isinstance(descriptor, AggregatingStateDescriptor)
        self._agg = descriptor.aggregate
        self._batch_reduction = batch.batch_reduction_of(descriptor.aggregate)

    def get(self) -> Any:
        acc = self.value()
        return None if acc is None else self._agg.get_result(acc)  # type: ignore[union-attr]

    def accumulator(self) -> Any:
        return self.value()

    def add_many(self, keys: Any, values: Any = None) -> None:
        """``add(value)`` of each key, in order: vectorized when the aggregate function has a
        :class:`~statelog.state.batch.BatchReduction` (``values`` may be ``None`` for
        :data:`~statelog.state.batch.COUNT`), else key by key."""
        if values is None and self._batch_reduction is not batch.COUNT:
            raise ConfigError(f"aggregating state {self.name!r}: add_many needs values (one per key)")
        batch.add_many(self, self._batch_reduction, keys, values, self.add)

    def add(self, value: Any) -> None:
        acc = self.value()
        if acc is None:
            acc = self._agg.create_accumulator()  # type: ignore[union-attr]
        self.update(self._agg.add(value, acc))  # type: ignore[union-attr]


STATE_CLASSES: dict[type, type[KeyedState]] = {
    ValueStateDescriptor: ValueState,
    ListStateDescriptor: ListState,
    MapStateDescriptor: MapState,
    ReducingStateDescriptor: ReducingState,
    AggregatingStateDescriptor: AggregatingState,
}


__all__ = ["STATE_CLASSES", "AggregatingState", "ReducingState", "ValueState"]
