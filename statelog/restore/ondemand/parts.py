"""The parts of one on-demand restore that its threads share (:class:`LoaderParts`)."""

from __future__ import annotations

from dataclasses import dataclass

from statelog.restore.ondemand.files import TableFiles
from statelog.restore.ondemand.prepare import EntryBuilder
from statelog.restore.ondemand.progress import Progress
from statelog.restore.ondemand.slices import Slices
from statelog.restore.ondemand.tail import TailReader

__all__ = ["LoaderParts"]


@dataclass(frozen=True)
class LoaderParts:
    """What the background thread (:mod:`~statelog.restore.ondemand.background`) and the
    rest loaded at once (:mod:`~statelog.restore.ondemand.bulk`) work with: the key groups'
    states and hand-over (``progress``), the table files, the tail, the entry builder and the
    slices, all built by the :class:`~statelog.restore.ondemand.loader.KeyGroupLoader`."""

    progress: Progress
    files: TableFiles
    tail: TailReader
    builder: EntryBuilder
    slices: Slices
