"""The changelog flushed after a checkpoint: what consistency ``"flushed"`` applies.

The writer uploads its changelog continuously, in segments named by writer and number
(``changelog/<writer id>/<number>.seg``, docs/format.md); a checkpoint references the
segments up to its sealed positions. :func:`flushed_ranges` lists the segments of the
writers a checkpoint references, from the newest one it references on, reads their footers
and returns, for the streams a replica follows, the records after what it applied, contiguous
per stream: a prefix of what the writer flushed, in order (up to the first segment number
not listed yet).
"""

from __future__ import annotations

from statelog.changelog.reader import SegmentReader
from statelog.changelog.segment import SegmentRef
from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata
from statelog.keys.groups import KeyGroupRange
from statelog.layout import CHANGELOG_PREFIX, parse_segment_key

__all__ = ["flushed_ranges"]


def flushed_ranges(
    reader: SegmentReader, meta: CheckpointMetadata, applied: dict[str, int], kgr: KeyGroupRange
) -> tuple[list[ChangelogRange], int | None]:
    """The ranges of the streams in ``applied`` (stream -> position applied) flushed after
    it, in the segments of the writers that ``meta`` references, and the creation time (ms)
    of the newest segment they come from (``None``: nothing flushed). ``applied`` is not
    changed; the caller applies the ranges and moves it on."""
    newest: dict[str, int] = {}  # writer id -> the newest segment number meta references
    for op in meta.operators.values():
        for h in op.subtasks:
            for r in h.changelog:
                if r.stream not in applied:
                    continue
                for seg in r.segments:
                    parsed = parse_segment_key(seg.name)
                    if parsed is not None:
                        newest[parsed[0]] = max(newest.get(parsed[0], -1), parsed[1])
    pos = dict(applied)
    out: list[ChangelogRange] = []
    created: int | None = None
    for writer, first in sorted(newest.items()):
        segments = []
        for info in reader.store.list(f"{CHANGELOG_PREFIX}{writer}/"):
            parsed = parse_segment_key(info.key)
            if parsed is not None and parsed[1] >= first:
                segments.append((parsed[1], info.key, info.size))
        expected = first
        for n, name, size in sorted(segments):
            if n != expected:  # (one still uploading: what follows waits for the next poll)
                break
            expected += 1
            footer = reader.footer(name, size)
            for span in footer.streams:
                at = pos.get(span.stream)
                if at is None or span.end <= at or span.start > at:
                    continue
                ref = SegmentRef(name, size, span.start, span.end, span.bytes)
                out.append(ChangelogRange(span.stream, at, span.end, kgr, (ref,)))
                pos[span.stream] = span.end
                created = footer.created_ms if created is None else max(created, footer.created_ms)
            reader.forget(name)
    return out, created
