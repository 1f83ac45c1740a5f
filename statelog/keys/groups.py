"""Key groups: the hash of a key's bytes, key-group ranges and their subtasks.

A key's key group is ``fmix32(crc32(key_bytes)) % max_parallelism`` of its canonical bytes
(:mod:`statelog.keys.encoding`; ``docs/format.md`` 3.2). Key groups are the unit of
distribution: subtask ``i`` of ``parallelism`` owns the :class:`KeyGroupRange` that
:func:`key_group_range_for_subtask` gives (Flink's formulas), whatever the parallelism a
checkpoint was taken with.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statelog import _ext
from statelog.errors import ConfigError, CorruptionError
from statelog.keys.encoding import encode_key

DEFAULT_MAX_PARALLELISM = 128
MAX_MAX_PARALLELISM = 32768


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def key_group_of_bytes_py(key_bytes: bytes, max_parallelism: int) -> int:
    """The key group of serialized key bytes: murmur3 fmix32 of CRC-32, modulo ``max_parallelism``
    (the reference; ``key_group_of_bytes`` is its C version when statelog/_ext is built)."""
    return _fmix32(zlib.crc32(key_bytes)) % max_parallelism


_workingset_ext = _ext.load("workingset")
key_group_of_bytes: Callable[[bytes, int], int] = (
    _workingset_ext.key_group if _workingset_ext is not None else key_group_of_bytes_py
)


def key_group_of(key: Any, max_parallelism: int) -> int:
    """The key group of a key: ``fmix32(crc32(encode_key(key))) % max_parallelism``."""
    return key_group_of_bytes(encode_key(key), max_parallelism)


def check_max_parallelism(max_parallelism: Any) -> int:
    if type(max_parallelism) is not int or not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ConfigError(
            f"max_parallelism must be an int in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism!r}"
        )
    return max_parallelism


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """An inclusive range of key groups ``[start, end]``; empty when ``end < start``."""

    start: int
    end: int

    @staticmethod
    def empty() -> KeyGroupRange:
        return KeyGroupRange(0, -1)

    @property
    def is_empty(self) -> bool:
        return self.end < self.start

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, kg: object) -> bool:
        return isinstance(kg, int) and self.start <= kg <= self.end

    def __iter__(self):  # type: ignore[override]
        return iter(range(self.start, self.end + 1))

    def intersect(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()

    def overlaps(self, lo: int, hi: int) -> bool:
        return not self.is_empty and lo <= self.end and hi >= self.start

    def to_json(self) -> list[int]:
        return [self.start, self.end]

    @staticmethod
    def from_json(value: Any) -> KeyGroupRange:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(type(v) is int for v in value)
        ):
            raise CorruptionError(f"a key-group range must be [start, end], got {value!r}")
        return KeyGroupRange(value[0], value[1])

    def __str__(self) -> str:
        return f"[{self.start}..{self.end}]" if not self.is_empty else "[]"


def check_parallelism(parallelism: Any, max_parallelism: int) -> int:
    if type(parallelism) is not int or not 1 <= parallelism <= max_parallelism:
        raise ConfigError(
            f"parallelism must be an int in 1..max_parallelism ({max_parallelism}), got {parallelism!r}"
        )
    return parallelism


def key_group_range_for_subtask(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """The key groups owned by subtask ``index`` of ``parallelism`` (Flink's formula)."""
    check_parallelism(parallelism, max_parallelism)
    if type(index) is not int or not 0 <= index < parallelism:
        raise ConfigError(f"subtask index must be in 0..{parallelism - 1}, got {index!r}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask index that owns ``key_group``: ``key_group * parallelism // max_parallelism``."""
    return key_group * parallelism // max_parallelism
