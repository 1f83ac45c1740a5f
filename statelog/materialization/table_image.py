"""Decoded local copies of state tables ("table images", ``docs/format.md`` section 14.1).

A restore from a local copy of a state table still pays what the copy cannot save: Parquet
decoding and turning encoded keys into keys. When every key of a table file is an int64 (the
common case of counters and aggregates keyed by id), the process that writes or reads the
file through local copies can also keep an *image* of it: the same rows with the keys
already decoded, as an uncompressed Arrow IPC file that a restore maps without decoding
anything. A restore installs its int64 keys straight into the state's table
(:func:`statelog._ext.inttable.put_arrays`), without key objects.

An image names the table file it was made from (its key, size and CRC-32, as the manifest
records them) and is served only for that file; the local copies' record holds the image's
own size and CRC-32 (like any copy). An image that fails either check is dropped and the
table file is read as usual: an image changes only speed.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa

from statelog.arrays import integer_numpy
from statelog.compute import pc
from statelog.errors import CorruptionError
from statelog.keys.columns import int64_key_array
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import TableFile
from statelog.store.base import ObjectStore
from statelog.store.copy_directory import IMAGE_SUFFIX

__all__ = [
    "IMAGE_SUFFIX", "IMAGE_VERSION", "decode_image", "encode_image", "image_key", "image_rows",
    "keep_image", "load_image",
]  # fmt: skip

log = logging.getLogger("statelog.store.local_copies")  # (the local copies' logger)

IMAGE_VERSION = 1
META_IMAGE = b"statelog.table-image"
META_SOURCE = b"statelog.source"
META_SOURCE_BYTES = b"statelog.source_bytes"
META_SOURCE_CRC = b"statelog.source_crc32"
# the columns a state table of a value, list or map state has (timers' tables have others)
_COLUMNS = ["key_group", "key", "namespace", "value", "expires_ms"]


def image_key(table_key: str) -> str:
    """The local copies' key of the image of table file ``table_key``."""
    return table_key + IMAGE_SUFFIX


def encode_image(table: pa.Table, path: str, size: int, crc32: int) -> bytes | None:
    """The image of the state table ``table`` that was written as the ``size`` bytes with
    ``crc32`` at ``path``; ``None`` when it has none (a key that is not an int64, a timers'
    table, no rows)."""
    if table.num_rows == 0 or table.column_names != _COLUMNS:
        return None
    keys = int64_key_array(table.column("key"))
    if keys is None:
        return None
    columns: dict[str, Any] = {
        "key_group": table.column("key_group"),
        "key": pa.array(keys, pa.int64()),
        "namespace": _small_dictionary(table.column("namespace")),
        "value": table.column("value"),
    }
    expires = table.column("expires_ms")
    if expires.type != pa.int64() or expires.null_count != len(expires):  # (a value state without TTL: not kept)
        columns["expires_ms"] = expires
    meta = {
        META_IMAGE: str(IMAGE_VERSION).encode(), META_SOURCE: path.encode(),
        META_SOURCE_BYTES: str(size).encode(), META_SOURCE_CRC: str(crc32).encode(),
    }  # fmt: skip
    image = pa.table(columns).replace_schema_metadata(meta).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, image.schema) as writer:
        writer.write_table(image)
    return sink.getvalue().to_pybytes()


def _small_dictionary(col: pa.ChunkedArray) -> pa.Array:
    """A namespace column as a dictionary of its distinct values (one byte a row while there
    are fewer than 128: a state without namespaces has one)."""
    encoded = pc.dictionary_encode(col.combine_chunks())
    if len(encoded.dictionary) < 128:
        encoded = pa.DictionaryArray.from_arrays(encoded.indices.cast(pa.int8()), encoded.dictionary)
    return encoded


def decode_image(data: Any, f: TableFile) -> pa.Table:
    """The rows of an image (bytes or a buffer) made from table file ``f``; raises
    :class:`CorruptionError` unless it is a well-formed image of exactly that file."""
    view = memoryview(data)
    if len(view) < 12 or bytes(view[:6]) != b"ARROW1" or bytes(view[-6:]) != b"ARROW1":
        raise CorruptionError(f"table image of {f.path}: not an Arrow IPC file", key=image_key(f.path))
    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        meta = reader.schema.metadata or {}
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise CorruptionError(f"table image of {f.path}: unreadable ({e})", key=image_key(f.path)) from None
    source = (meta.get(META_SOURCE), meta.get(META_SOURCE_BYTES), meta.get(META_SOURCE_CRC))
    if meta.get(META_IMAGE) != str(IMAGE_VERSION).encode():
        raise CorruptionError(f"table image of {f.path}: not a version {IMAGE_VERSION} image", key=image_key(f.path))
    if source != (f.path.encode(), str(f.bytes).encode(), str(f.crc32).encode()):
        raise CorruptionError(
            f"table image of {f.path}: made from another file ({source[1]!r} bytes with CRC-32 {source[2]!r}, the "
            f"manifest records {f.bytes} with {f.crc32})",
            key=image_key(f.path),
        )
    names = table.column_names
    if (
        names not in (_COLUMNS[:4], _COLUMNS)
        or table.schema.field("key").type != pa.int64()
        or table.schema.field("key_group").type != pa.int32()
        or not pa.types.is_dictionary(table.schema.field("namespace").type)
        or table.num_rows != f.rows
        or any(table.column(c).null_count for c in ("key_group", "key", "namespace"))
    ):
        raise CorruptionError(f"table image of {f.path}: unexpected columns or rows", key=image_key(f.path))
    kgs = integer_numpy(table.column("key_group"))
    if len(kgs) and (not bool((np.diff(kgs) >= 0).all()) or kgs[0] < f.key_groups.start or kgs[-1] > f.key_groups.end):
        raise CorruptionError(f"table image of {f.path}: key groups out of order or range", key=image_key(f.path))
    return table


def image_rows(table: pa.Table, kgr: KeyGroupRange, only: list[int] | None = None) -> pa.Table:
    """The rows of ``table`` (an image's, sorted by key group) in ``kgr`` (with ``only``: in
    those of its key groups), without copying when they are one run."""
    kgs = integer_numpy(table.column("key_group"))
    lo, hi = np.searchsorted(kgs, [kgr.start, kgr.end + 1])
    rows = table.slice(int(lo), int(hi - lo))
    if only is not None:
        rows = rows.filter(pc.is_in(rows.column("key_group"), pa.array(only, pa.int32())))
    return rows


def keep_image(store: ObjectStore, table: pa.Table, f: TableFile) -> None:
    """Keep the image of ``table``, just written as table file ``f``, in ``store``'s local
    copies (if it keeps any and the table has an image)."""
    copies = store.local_copies
    if copies is None:
        return
    try:
        data = encode_image(table, f.path, f.bytes, f.crc32)
    except (pa.ArrowException, ValueError, MemoryError) as e:  # (an image changes only speed)
        log.warning("no table image of %s: %s", f.path, e)
        return
    if data is not None and copies.add(image_key(f.path), data):
        with copies.stats._lock:
            copies.stats.images_made += 1


def load_image(store: ObjectStore, f: TableFile) -> pa.Table | None:
    """The rows of table file ``f`` from its verified image in ``store``'s local copies, or
    ``None`` (no copies, no image, or a damaged one: dropped and logged)."""
    copies = store.local_copies
    if copies is None:
        return None
    key = image_key(f.path)
    data = copies.get(key)  # (verified against the size and CRC-32 recorded when it was made)
    if data is None:
        return None
    try:
        table = decode_image(data, f)
    except CorruptionError as e:
        copies.drop(key, str(e))
        return None
    with copies.stats._lock:
        copies.stats.hits += 1
        copies.stats.image_hits += 1
        copies.stats.bytes_local += len(data)
    return table
