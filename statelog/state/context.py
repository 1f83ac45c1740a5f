"""The key context: what the states and timers of one keyed backend know of the current key.

After Flink's ``InternalKeyContext``. A :class:`KeyedStateBackend
<statelog.state.backend.KeyedStateBackend>` owns one :class:`KeyContext` and hands it to each of
its states and to its timer service instead of itself, so the states and timers depend on
this small documented object, never on the backend's fields (and their modules do not
import :mod:`statelog.state.backend`).

Only the backend writes the current key: its ``set_current_key`` encodes the key (cached),
checks its key group and then stores ``key`` and ``key_info`` here, once per record. The
states read them on every access: ``ctx.key`` indexes the in-memory tables and
``ctx.key_info`` gives the key bytes and key group of the change records. The C fast path
(``statelog/_ext/fastpath.c``) reads the same two slots; it locates them once, when a
state's update is built, from the slot descriptors of this class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statelog.errors import SerializationError, StatelogError
from statelog.keys.encoding import decode_key, encode_key


class _NoCurrentKey:
    """The current key before ``set_current_key``: any state access fails clearly."""

    def __hash__(self) -> int:
        raise StatelogError(
            "no current key: call backend.set_current_key(key) before accessing keyed state"
        )

    def __eq__(self, other: object) -> bool:
        return other is self

    def __repr__(self) -> str:
        return "<no current key>"


NO_KEY: Any = _NoCurrentKey()
# the key info while no key is set: no type, no bytes, no key group
NO_KEY_INFO: tuple[type, bytes, int] = (type(None), b"", -1)


def _nothing() -> None:
    return None


def _no_batch_keys(_keys: Any, _int_column: bool = False) -> Any:
    raise StatelogError("this key context has no batch key check: the backend that owns it installs one")


def _unset(_key: Any) -> None:
    raise StatelogError("this key context has no key setter: the backend that owns it installs one")


class KeyContext:
    """The current key of one keyed backend, shared by its states and its timer service.

    Slots (read them, never write them outside the owning backend):

    * ``key``: the current key object (:data:`NO_KEY` before the first
      ``set_current_key``; hashing it raises a clear :class:`StatelogError`).
    * ``key_info``: ``(type, key bytes, key group)`` of the current key: the type the key
      cache saw first for it, its canonical encoding (:func:`statelog.keys.encoding.encode_key`) and
      its key group (:data:`NO_KEY_INFO` before the first key).
    * ``set_current_key``: the backend's key setter (checks the key group, caches the
      encoding, writes ``key`` and ``key_info``); the timer service sets the key of a
      firing timer through it.
    * ``clock``: the backend's clock, milliseconds (TTL expiry).
    * ``changelog_enabled``: whether mutations are recorded (a backend with a changelog
      writer) or only kept in memory.
    * ``operator_uid``: the operator the backend belongs to (for error messages).
    * ``load_all``: loads every key group not loaded yet (an on-demand restore,
      :mod:`statelog.restore.ondemand`); whole-state reads (``entries()``) call it first.
    * ``batch_keys``: the backend's check of a batch call's keys
      (:func:`statelog.state.backend.batch_keys`).
    * ``working_set``: the store its states keep their entries in
      (:mod:`statelog.state.tables`: dicts, or the disk-backed working set); set by the
      backend, ``None`` for a context no backend owns (its states use dicts).
    """

    __slots__ = (
        "key", "key_info", "set_current_key", "clock", "changelog_enabled", "operator_uid", "load_all", "working_set",
        "batch_keys",
    )

    def __init__(self, operator_uid: str, clock: Callable[[], int], changelog_enabled: bool) -> None:
        self.key: Any = NO_KEY
        self.key_info: tuple[type, bytes, int] = NO_KEY_INFO
        self.set_current_key: Callable[[Any], None] = _unset
        self.clock = clock
        self.changelog_enabled = changelog_enabled
        self.operator_uid = operator_uid
        self.load_all: Callable[[], None] = _nothing
        # the store of the states' entries (statelog.state.tables), set by the backend
        self.working_set: Any = None
        # the keys of a batch call: (python keys, encoded keys, key groups), set by the backend
        self.batch_keys: Callable[..., tuple[Any, Any, Any]] = _no_batch_keys

    @property
    def current_key(self) -> Any:
        """The current key (``None`` also when no key was set yet)."""
        key = self.key
        return None if key is NO_KEY else key

    @property
    def key_group(self) -> int:
        """The key group of the current key (-1 before the first key)."""
        return self.key_info[2]

    def legacy_key_error(self, state: str, kb: bytes) -> SerializationError:
        """The error for a restored key (or namespace) in key encoding version 1 that version 2
        encodes differently (a bool or an integral float): a job cannot continue from it."""
        key = decode_key(kb)
        try:
            now = f"stores it as {decode_key(encode_key(key))!r} in another key group"
        except SerializationError:
            now = "refuses it (NaN)"
        return SerializationError(
            f"operator {self.operator_uid!r} state {state!r}: the checkpoint holds the key or namespace "
            f"{key!r} in key encoding version 1 (bytes {kb.hex()}), before keys followed Python "
            f"equality; version 2 {now}, so a job cannot continue from this checkpoint (docs/format.md "
            "3.1). Read the state with statelog sql or the Spark data source and write it into a new "
            "job, or continue it with the statelog version that wrote it"
        )

    def __repr__(self) -> str:
        return f"KeyContext(operator_uid={self.operator_uid!r}, key={self.key!r}, key_group={self.key_group})"


__all__ = ["NO_KEY", "NO_KEY_INFO", "KeyContext"]
