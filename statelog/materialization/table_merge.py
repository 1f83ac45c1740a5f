"""A state's new table rows: its base rows with its change records applied, per entry.

The result of the state kind's applier (:mod:`statelog.restore.appliers`) on the image the
base rows hold: vectorized in Arrow for value-like states and timers (the last record per
entry wins), rebuilt in Python for lists and maps. :class:`~statelog.materialization.table_writer.StateTableWriter`
merges a run of key groups at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import booleans, numpy_integers
from statelog.changelog.ops import Op
from statelog.changelog.reader import ChangeBatch
from statelog.compute import pc
from statelog.descriptors import StateInfo
from statelog.materialization.table_schema import image_to_table, table_schema, table_to_image
from statelog.restore.appliers import TimerApplier, applier_for


def merge_last_wins(info: StateInfo, base: list[pa.Table], tail: list[pa.Table]) -> pa.Table | None:
    """Value-like states and timers, in Arrow: the last record per entry decides.

    The result of :class:`~statelog.restore.appliers.ValueApplier` (timers:
    :class:`~statelog.restore.appliers.TimerApplier`) on the image, vectorized (tested against
    them): base rows count as puts (timers: adds) before every change record; per
    ``(key_group, key, namespace)`` (timers: plus timestamp) the last record wins and
    entries whose last record is a delete (timer removal) are dropped.
    """
    schema = table_schema(info)
    applier = applier_for(info)
    timers = isinstance(applier, TimerApplier)
    vcol = "timestamp" if timers else "value"
    put = Op.TIMER_ADD.value if timers else Op.PUT.value
    vtype = schema.field(vcol).type
    parts = []
    n = 0
    for t in base:
        m = t.num_rows
        cols = [t.column("key_group"), t.column("key"), t.column("namespace"), t.column(vcol)]
        cols.append(pa.nulls(m, pa.int64()) if timers else t.column("expires_ms"))
        cols += [numpy_integers(np.full(m, put, np.uint8)), numpy_integers(np.arange(n, n + m, dtype=np.int64))]
        parts.append(cols)
        n += m
    for t in tail:
        m = t.num_rows
        ops = t.column("op")
        bad = pc.filter(ops, pc.invert(pc.is_in(ops, numpy_integers(np.array(sorted(applier.ops), np.uint8)))))
        if len(bad):
            raise applier.invalid(bad[0].as_py())
        value = t.column("value")
        if value.type != vtype:
            value = value.cast(vtype)
        exp = t.column("expires_ms")
        if exp.type != pa.int64():
            exp = exp.cast(pa.int64())
        cols = [t.column("key_group").cast(pa.int32()), t.column("key"), t.column("namespace"), value, exp,
                ops, numpy_integers(np.arange(n, n + m, dtype=np.int64))]
        parts.append(cols)
        n += m
    if n == 0:
        return None
    names = ["key_group", "key", "namespace", "v", "expires_ms", "op", "ord"]
    combined = pa.concat_tables([pa.table(cols, names=names) for cols in parts]) if len(parts) > 1 \
        else pa.table(parts[0], names=names)
    group = ["key_group", "key", "namespace"] + (["v"] if timers else [])
    order = pc.sort_indices(combined, sort_keys=[(c, "ascending") for c in [*group, "ord"]])
    srt = combined.take(order)
    if srt.num_rows > 1:
        diff = None
        for c in group:
            col = srt.column(c)
            ne = pc.not_equal(col.slice(1), col.slice(0, srt.num_rows - 1))
            diff = ne if diff is None else pc.or_(diff, ne)
        last = pa.chunked_array([*diff.chunks, booleans(np.ones(1, bool))]) if isinstance(diff, pa.ChunkedArray) \
            else pa.concat_arrays([diff, booleans(np.ones(1, bool))])
    else:
        last = booleans(np.ones(srt.num_rows, bool))
    keep = pc.and_(last, pc.equal(srt.column("op"), numpy_integers(np.array([put], np.uint8))[0]))
    out = srt.filter(keep)
    if timers:
        arrays = [out.column("key_group"), out.column("key"), out.column("namespace"), out.column("v")]
    else:
        arrays = [out.column("key_group"), out.column("key"), out.column("namespace"), out.column("v"),
                  out.column("expires_ms")]
    return pa.Table.from_arrays(arrays, schema=schema)


def merge_python(info: StateInfo, base: list[pa.Table], tail: list[pa.Table]) -> pa.Table | None:
    """List and map states: rebuild entries in Python (appends and per-entry puts) with the
    state kind's applier; entries keep their expiry (``expiring``), keyed by
    ``(key_group, key, namespace)``."""
    img: dict[Any, Any] = {}
    for t in base:
        img.update(table_to_image(info, t))
    apply = applier_for(info, expiring=True).apply
    for t in tail:
        for _seq, kg, op, kb, nsb, uk, v, exp in ChangeBatch("", t).rows():
            apply(img, (kg, kb, nsb), op, uk, v, exp)
    if not img:
        return None
    return image_to_table(info, sorted(img.items(), key=lambda kv: kv[0]))
