"""A checkpoint's reference to a changelog segment (:class:`SegmentRef`).

Apart from :mod:`statelog.changelog.segment` (the encoding, which needs pyarrow) so that
checkpoint metadata is read without pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SegmentRef:
    """One segment holding records ``[start, end)`` of a stream (``bytes`` of its blocks)."""

    name: str
    size: int
    start: int
    end: int
    bytes: int

    def to_json(self) -> list[Any]:
        return [self.name, self.size, self.start, self.end, self.bytes]

    @staticmethod
    def from_json(v: Any) -> SegmentRef:
        name, size, start, end, nbytes = v
        return SegmentRef(str(name), int(size), int(start), int(end), int(nbytes))
