"""Key groups loaded by slices: the key ranges of their row groups.

A key group with several row groups of its own in a table file is loaded by *slices*, the
key ranges of those row groups (their statistics on ``key``,
:func:`statelog.materialization.key_slices`): a first touch prepares the slice of the key
only (the row groups that may hold its range, and the records of the key group's tail in the
range); the key group is then partly loaded, and its other slices load when touched, the
rest (without the slices handed out) in the background or when the task thread loads the rest.
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf

import numpy as np
import pyarrow as pa

from statelog.arrays import booleans, integer_numpy
from statelog.descriptors import StateInfo
from statelog.keys.columns import encode_int64_keys
from statelog.materialization.key_slices import decode_key_range, key_range_mask, key_slices
from statelog.restore.ondemand.files import TableFiles
from statelog.restore.ondemand.prepare import EntryBuilder, PreparedKeyGroup
from statelog.restore.ondemand.tail import Records, TailReader

__all__ = ["Slices"]


class Slices:
    """The slices of each key group (its bounds: an empty list when it is loaded whole), the
    slices of each partly loaded key group handed out, and the preparation of a slice or of
    what is left of a key group."""

    def __init__(self, files: TableFiles, tail: TailReader, builder: EntryBuilder) -> None:
        self._files = files
        self._tail = tail
        self._builder = builder
        self.bounds: dict[int, list[bytes]] = {}
        self.taken: dict[int, set[int]] = {}  # slices handed out, of each PARTIAL key group

    def bounds_of(self, kg: int) -> list[bytes]:
        """The bounds of key group ``kg``'s slices (``[]``: it is loaded whole), from the row
        groups of its largest table file (by the thread that prepares ``kg``)."""
        bounds = self.bounds.get(kg)
        if bounds is None:
            bounds = []
            for (_info, f, _mine), entry in self._files.of.get(kg, ()):
                with entry.lock:
                    data = self._files.source(entry, f)
                b = key_slices(data, f, kg)
                if len(b) > len(bounds):
                    bounds = b
            self.bounds[kg] = bounds
        return bounds

    def index(self, kg: int, kb: bytes) -> int:
        """The slice of key group ``kg`` that holds key bytes ``kb``."""
        return bisect.bisect_right(self.bounds[kg], kb)

    def key_range(self, kg: int, i: int) -> tuple[bytes | None, bytes | None]:
        bounds = self.bounds[kg]
        return (bounds[i - 1] if i > 0 else None, bounds[i] if i < len(bounds) else None)

    def prepare_slice(self, kg: int, i: int, tail: cf.Future[Records] | None = None) -> PreparedKeyGroup:
        """Slice ``i`` of key group ``kg``: the row groups of its table files that may hold its
        keys, decoded, its rows and its share of the key group's tail (``tail``: being read)."""
        lo, hi = self.key_range(kg, i)
        decoded = []
        for (info, f, _mine), entry in self._files.of.get(kg, ()):
            with entry.lock:
                data = self._files.source(entry, f)
            decoded.append((info, decode_key_range(data, f, kg, lo, hi, info)))
        kg_tail = self._tail.of_key_group(kg) if tail is None else tail.result()
        return self._builder.entries([kg], decoded, {kg: self._tail_of_slices(kg, kg_tail, {i}, True)})[0]

    def prepare_rest(
        self, kg: int, tail: cf.Future[Records] | None = None, decoded: list[tuple[StateInfo, pa.Table]] | None = None
    ) -> PreparedKeyGroup:
        """What is left of key group ``kg`` after the slices handed out, all of it if none was
        (by the thread that holds it as PREPARING; ``tail``: its tail, being read;
        ``decoded``: its rows, :meth:`rest_rows`, if they were decoded already)."""
        taken = sorted(self.taken.get(kg, ()))
        if decoded is None:
            decoded = self.rest_rows(kg)
        records = self._tail.of_key_group(kg) if tail is None else tail.result()
        self._tail.release(kg)
        if taken:
            records = self._tail_of_slices(kg, records, set(taken), False)
        return self._builder.entries([kg], decoded, {kg: records})[0]

    def rest_rows(self, kg: int) -> list[tuple[StateInfo, pa.Table]]:
        """The rows of key group ``kg`` without those of the slices handed out, decoded."""
        taken = sorted(self.taken.get(kg, ()))
        decoded = self._files.decode([kg])
        if not taken:
            return decoded
        out = []
        for info, rows in decoded:
            keys = rows.column("key")
            if keys.type == pa.int64():  # a table image's decoded keys: compared as their bytes
                keys = encode_int64_keys(integer_numpy(keys))
            drop = np.zeros(len(keys), bool)
            for i in taken:
                drop |= key_range_mask(keys, *self.key_range(kg, i))
            out.append((info, rows.filter(booleans(~drop))))
        return out

    def _tail_of_slices(self, kg: int, tail: Records, slices: set[int], inside: bool) -> Records:
        """The records of ``tail`` (key group ``kg``'s) whose key is in one of ``slices``
        (``inside``) or in none of them, in order."""
        bounds, bisect_right = self.bounds[kg], bisect.bisect_right
        out = {}
        for name, recs in tail.items():
            kept = [r for r in recs if (bisect_right(bounds, r[0]) in slices) is inside]
            if kept:
                out[name] = kept
        return out
