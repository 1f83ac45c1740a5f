"""The changelog flushed after a checkpoint: what consistency ``"flushed"`` applies.

The writer uploads its changelog continuously, in segments named by writer and number
(``changelog/<writer id>/<number>.seg``, docs/format.md); a checkpoint references the
segments up to its sealed positions. :func:`flushed_ranges` lists the segments of the
writers a checkpoint references that write under the lease generation that published it,
while that generation is the newest (:func:`current_writers`), from the newest segment it
references on, reads their footers
and returns, for the streams a replica follows, the records after what it applied, contiguous
per stream: a prefix of what the writer flushed, in order (up to the first segment number
not listed yet).
"""

from __future__ import annotations

import itertools
import logging

from statelog.changelog.reader import SegmentReader
from statelog.changelog.segment_ref import SegmentRef
from statelog.checkpoint.lease_objects import read_object
from statelog.checkpoint.metadata import ChangelogRange, CheckpointMetadata
from statelog.errors import CorruptionError, ObjectNotFoundError
from statelog.following.replica import OperatorReplica, Prepared
from statelog.keys.groups import KeyGroupRange
from statelog.layout import (
    WRITER_LEASE_PREFIX,
    lease_generation_key,
    parse_segment_key,
    segment_key,
)

__all__ = ["current_writers", "flushed_ranges", "read_flushed"]

log = logging.getLogger(__name__)


def current_writers(reader: SegmentReader, meta: CheckpointMetadata, writers: set[str], acquired: dict[int, int]) -> set[str]:
    """The writers of ``writers`` (ids) that write under the writer lease generation that
    published ``meta``, while it is the newest: a writer id begins with its creation time
    (ms), and a process creates its writer after it took the lease, so writers created before
    that generation was acquired are writers of earlier runs whose streams ``meta`` inherited.
    Once a newer generation was acquired, none: what the old one flushed after ``meta`` will
    never be in a checkpoint (the new writer restores a checkpoint). None either without a
    generation or its lease object. ``acquired`` caches each generation's acquisition time."""
    g = meta.writer_generation
    if not writers or g is None:
        return set()
    start = _acquired_ms(reader, g, acquired)
    if start is None or _acquired_ms(reader, g + 1, acquired) is not None:
        return set()
    return {w for w in writers if start <= _created_ms(w)}


def _acquired_ms(reader: SegmentReader, g: int, acquired: dict[int, int]) -> int | None:
    """When writer lease generation ``g`` was acquired (the holder's clock), ``None`` if it was not (yet)."""
    at = acquired.get(g)
    if at is None:
        try:
            body = read_object(reader.store, lease_generation_key(WRITER_LEASE_PREFIX, g), "acquire", g)
            at = acquired[g] = int(body["acquired_ms"])
        except (ObjectNotFoundError, CorruptionError, KeyError, TypeError, ValueError):
            return None
    return at


def _created_ms(writer: str) -> int:
    head = writer.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def flushed_ranges(
    reader: SegmentReader, meta: CheckpointMetadata, applied: dict[str, int], kgr: KeyGroupRange,
    acquired: dict[int, int], sizes: dict[str, int],
) -> tuple[list[ChangelogRange], int | None]:
    """The ranges of the streams in ``applied`` (stream -> position applied) flushed after
    it, in the segments of the current writers that ``meta`` references
    (:func:`current_writers`; ``acquired`` is its cache), and the creation time (ms)
    of the newest segment they come from (``None``: nothing flushed). ``applied`` is not
    changed; the caller applies the ranges and moves it on.

    A writer numbers its segments one after the other: from the newest one ``meta``
    references, each next number is asked for by name (``head``), not by listing the
    writer's segments, until one is not there. ``sizes`` (segment -> size) keeps what was
    found for the next call, so a poll asks only for the segment after the newest one it saw
    (and the reader, which keeps footers, reads only new footers)."""
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
    live = current_writers(reader, meta, set(newest), acquired)
    newest = {w: n for w, n in newest.items() if w in live}
    pos = dict(applied)
    out: list[ChangelogRange] = []
    created: int | None = None
    for name in [k for k in sizes if (p := parse_segment_key(k)) is None or p[1] < newest.get(p[0], 1 << 62)]:
        del sizes[name]  # (before what meta references: never asked for again)
    for writer, first in sorted(newest.items()):
        for n in itertools.count(first):
            name = segment_key(writer, n)
            size = sizes.get(name)
            if size is None:
                info = reader.store.head(name)
                if info is None:  # (not uploaded yet, or still uploading: what follows waits for the next poll)
                    break
                size = sizes[name] = info.size
            footer = reader.footer(name, size)  # (read once: the caller's reader keeps footers between polls)
            used = False
            for span in footer.streams:
                at = pos.get(span.stream)
                if at is None or span.end <= at or span.start > at:
                    continue
                ref = SegmentRef(name, size, span.start, span.end, span.bytes)
                out.append(ChangelogRange(span.stream, at, span.end, kgr, (ref,)))
                pos[span.stream] = span.end
                created = footer.created_ms if created is None else max(created, footer.created_ms)
                used = True
            if not used:  # (else its blocks are read next, from the bytes read with the footer)
                reader.forget(name)
    return out, created


def read_flushed(
    reader: SegmentReader, meta: CheckpointMetadata, replicas: dict[str, OperatorReplica], acquired: dict[int, int],
    sizes: dict[str, int],
) -> tuple[dict[str, Prepared], int | None]:
    """Per replica the flushed changes after what it applied (:func:`flushed_ranges`), read
    for its ``install``, and the creation time (ms) of the newest segment they come from. A
    replica whose segments were collected or replaced while found is left for the next poll."""
    prepared: dict[str, Prepared] = {}
    newest: int | None = None
    for uid, rep in list(replicas.items()):
        try:
            ranges, created = flushed_ranges(reader, meta, rep.applied, rep.key_groups, acquired, sizes)
            if ranges:
                prepared[uid] = rep.read(reader, ranges)
        except CorruptionError as e:
            reader.trim(0)
            log.info("follower: flushed changelog of operator %r not read this time: %s", uid, e)
            continue
        if created is not None:
            newest = created if newest is None else max(newest, created)
    return prepared, newest
