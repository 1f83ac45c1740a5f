"""The tuning of an on-demand restore, one frozen object (``StateJob.on_demand_options``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from statelog.changelog.reader import TAIL_READ_BYTES
from statelog.materialization.ranged import RANGED_MIN_BYTES
from statelog.options.base import Options, option
from statelog.options.values import Count, Size

_MAX_BYTES = 1 << 40


@dataclass(frozen=True)
class OnDemandOptions(Options):
    """How a :class:`~statelog.restore.ondemand.loader.KeyGroupLoader` reads and prepares key
    groups: how far its threads work ahead, how many requests run at once, and which reads
    go in ranges. The defaults are the measured ones (docs/performance.md); tests set small
    values to reach every path with small states."""

    KIND: ClassVar[str] = "on-demand restore option"

    read_ahead: int = option(8, "key groups the background thread prepares ahead of the task thread's "
                             "installations (a disk-backed working set: 1)", Count("read_ahead", 1, 1 << 20))
    decode_ahead: int = option(2, "pieces of key groups decoded ahead when the task thread loads the rest "
                               "(wait_loaded)", Count("decode_ahead", 1, 64))
    unit_rows: int = option(131_072, "rows of such a piece, about (whole key groups)",
                            Count("unit_rows", 1, 1 << 40))
    fetch_ahead_bytes: int = option(256 << 20, "table file bytes fetched ahead of their decoding when the "
                                    "task thread loads the rest", Size("fetch_ahead_bytes", 0, _MAX_BYTES))
    fetch_threads: int = option(4, "table files fetched at once when the task thread loads the rest",
                                Count("fetch_threads", 1, 64))
    tail_piece_rows: int = option(4096, "change records turned into Python objects between two safe points of "
                                  "the background thread", Count("tail_piece_rows", 1, 1 << 30))
    touch_whole_bytes: int = option(1 << 20, "a key group's own tail reads segments larger than this in ranges "
                                    "(footer and blocks of its key group)",
                                    Size("touch_whole_bytes", 0, _MAX_BYTES))
    io_threads: int = option(4, "segments a key group's own tail reads at once", Count("io_threads", 1, 64))
    touch_keep_bytes: int = option(64 << 20, "decoded blocks of small segments kept for other key groups' "
                                   "touches", Size("touch_keep_bytes", 0, _MAX_BYTES))
    segment_read_cost_bytes: int = option(
        16 << 10, "a segment read costs about as much as turning this many bytes of a segment into records: a "
        "tail of at most this many bytes per segment is read whole by the first key group that needs it (a "
        "touch of a key group alone would read every segment, and so would the next one)",
        Size("segment_read_cost_bytes", 0, _MAX_BYTES))
    ranged_min_bytes: int = option(RANGED_MIN_BYTES, "a touch reads a table file of at least this many bytes in "
                                   "ranges (its footer, then the row groups it needs), if its manifest entry "
                                   "has the checksums of its parts", Size("ranged_min_bytes", 0, _MAX_BYTES))
    tail_read_bytes: int = option(TAIL_READ_BYTES, "a touch that reads a segment in ranges reads this many of its "
                                  "last bytes at once: its trailer and (mostly) its footer",
                                  Size("tail_read_bytes", 1, _MAX_BYTES))
