"""Table images (statelog.materialization.table_image, docs/format.md 14.1): the decoded local
copy of a state table of int64 keys. A restore from images equals a restore from the files
(eager and on demand, in memory and on disk, one namespace or several, with TTL); an image
that is damaged, truncated or made from another file is dropped, logged and the file read
instead; tables without int64 keys get none."""

from __future__ import annotations

import dataclasses
import random
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import statelog
from materializer.build import materialize
from statelog import ListStateDescriptor, TtlConfig, ValueStateDescriptor
from statelog.errors import CorruptionError
from statelog.keys.encoding import encode_key
from statelog.keys.groups import KeyGroupRange
from statelog.materialization.manifest import TableFile
from statelog.materialization.table_image import (
    IMAGE_SUFFIX,
    decode_image,
    encode_image,
    image_rows,
)
from statelog.materialization.table_schema import encode_parquet
from statelog.restore.changes import base_entries
from statelog.state_info import StateInfo

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)
NAME = ValueStateDescriptor("name", pa.string())
SEEN = ListStateDescriptor("seen", pa.int64())


def _table(keys: list[Any], kgs: list[int], values: list[Any], nss: list[bytes] | None = None) -> pa.Table:
    n = len(keys)
    return pa.table({
        "key_group": pa.array(kgs, pa.int32()),
        "key": pa.array([encode_key(k) for k in keys], pa.binary()),
        "namespace": pa.array(nss or [encode_key(None)] * n, pa.binary()),
        "value": pa.array(values, pa.int64()),
        "expires_ms": pa.nulls(n, pa.int64()),
    })  # fmt: skip


def _file(table: pa.Table) -> TableFile:
    """The manifest's entry of ``table`` written as a table file of key groups 0-7."""
    return TableFile.of("materializations/data/m-1/000-count-kg00000-00007.parquet", KeyGroupRange(0, 7), table.num_rows,
                        encode_parquet(table))  # fmt: skip


def test_an_image_holds_the_same_entries_with_the_keys_decoded() -> None:
    keys = [5, -1, 2**63 - 1, -(2**63), 0, 77]
    table = _table(keys, [0, 0, 2, 3, 3, 7], [10, 11, 12, 13, 14, 15])
    f = _file(table)
    data = encode_image(table, f.path, f.bytes, f.crc32)
    assert data is not None
    image = decode_image(data, f)
    assert image.column("key").to_pylist() == keys
    info = StateInfo.from_descriptor(COUNT)
    k1, n1, v1 = base_entries(info, image)
    k2, n2, v2 = base_entries(info, table)
    assert isinstance(k1, np.ndarray) and k1.tolist() == list(k2) == keys
    assert n1 == n2 and list(v1) == list(v2)
    # a disk-backed working set gets the key bytes back
    assert base_entries(info, image, raw_keys=True)[0] == table.column("key").to_pylist()
    assert image_rows(image, KeyGroupRange(2, 3)).column("key").to_pylist() == keys[2:5]
    assert image_rows(image, KeyGroupRange(0, 7), [0, 7]).column("key").to_pylist() == [5, -1, 77]


def test_tables_without_int64_keys_have_no_image() -> None:
    assert encode_image(_table(["a", "b"], [0, 1], [1, 2]), "p", 1, 1) is None
    assert encode_image(_table([1, "b"], [0, 1], [1, 2]), "p", 1, 1) is None
    assert encode_image(_table([1, 2**70], [0, 1], [1, 2]), "p", 1, 1) is None
    assert encode_image(_table([], [], []), "p", 1, 1) is None
    timers = pa.table({"key_group": pa.array([0], pa.int32()), "key": [encode_key(1)],
                       "namespace": [encode_key(None)], "timestamp": [5]})  # fmt: skip
    assert encode_image(timers, "p", 1, 1) is None


@pytest.mark.parametrize("damage", ["magic", "truncate", "other file", "other rows"])
def test_an_image_that_is_not_exactly_one_of_its_file_is_refused(damage: str) -> None:
    table = _table(list(range(100)), sorted(random.Random(1).choices(range(8), k=100)), list(range(100)))
    f = _file(table)
    data = encode_image(table, f.path, f.bytes, f.crc32)
    assert data is not None
    # (a byte flipped inside is the local copies' record's to catch: its CRC-32, tested below)
    if damage == "magic":
        data = bytes([data[0] ^ 0xFF]) + data[1:]
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "other file":
        f = _file(table.slice(1))  # (another file under the same name)
    else:
        f = dataclasses.replace(f, rows=99)
    with pytest.raises(CorruptionError, match="table image"):
        decode_image(data, f)


def _write(root: str, copies: Path, descs: list[Any], namespaces: bool = False) -> dict[str, dict[Any, Any]]:
    """State of int keys written through local copies (so their images are made), materialized,
    a tail on top, checkpointed: what every state holds, per (namespace, key)."""
    expected: dict[str, dict[Any, Any]] = {d.name: {} for d in descs}
    with statelog.open(root, max_parallelism=16, local_copies={"directory": str(copies)}) as job:
        b = job.backend("op")
        states = {d.name: b.get_state(d) for d in descs}
        for rnd in range(2):
            for k in range(rnd * 50, 400):
                b.set_current_key(k)
                for ns in ([None, "w1", "w2"] if namespaces else [None]):
                    if ns is not None:
                        for s in states.values():
                            s.set_namespace(ns)
                    elif namespaces:
                        for s in states.values():
                            s.set_namespace(None)
                    for name, s in states.items():
                        if name == "seen":
                            s.add(k * 10 + rnd)
                            expected[name].setdefault((ns, k), []).append(k * 10 + rnd)
                        elif name == "name":
                            s.update(f"n{k}.{rnd}")
                            expected[name][(ns, k)] = f"n{k}.{rnd}"
                        else:
                            s.update(k * 3 + rnd)
                            expected[name][(ns, k)] = k * 3 + rnd
            meta = job.checkpoint()
            if rnd == 0:
                materialize(job.store, meta)
    return expected


def _check(root: str, copies: Path | None, descs: list[Any], expected: dict[str, dict[Any, Any]], *,
           on_demand: bool, disk: bool = False) -> Any:  # fmt: skip
    setting = {"directory": str(copies)} if copies is not None else None
    with statelog.open(root, create=False, writer_lease=False, on_demand_restore=on_demand, local_copies=setting,
                       state_store="disk" if disk else "memory") as job:  # fmt: skip
        b = job.backend("op", restore="latest", changelog=False)
        states = {d.name: b.get_state(d) for d in descs}
        for name, want in expected.items():
            s = states[name]
            for (ns, k), v in want.items():
                b.set_current_key(k)
                s.set_namespace(ns)
                got = s.get() if name == "seen" else s.value()
                assert (list(got) if name == "seen" else got) == v, (name, ns, k)
        return job.local_copies.stats if job.local_copies is not None else None


@pytest.mark.parametrize("on_demand", [False, True])
@pytest.mark.parametrize("disk", [False, True])
def test_a_restore_from_images_equals_one_from_the_files(tmp_path: Path, on_demand: bool, disk: bool) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    descs = [COUNT, SEEN]
    expected = _write(root, copies, descs)
    assert list(copies.rglob("*" + IMAGE_SUFFIX)), "the materializer kept no image"
    _check(root, None, descs, expected, on_demand=on_demand, disk=disk)  # from the store
    st = _check(root, copies, descs, expected, on_demand=on_demand, disk=disk)
    assert st.image_hits > 0 and st.misses == 0 and st.dropped == 0, st


def test_deleting_a_table_file_deletes_its_image(tmp_path: Path) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    _write(root, copies, [COUNT])
    image = next(copies.rglob("*" + IMAGE_SUFFIX))
    base = next(copies.iterdir())
    table_key = image.relative_to(base).as_posix()[: -len(IMAGE_SUFFIX)]
    with statelog.open(root, create=False, writer_lease=False, local_copies={"directory": str(copies)}) as job:
        job.store.delete(table_key)  # (as GC deletes a table no checkpoint references)
    assert not image.exists() and not (base / table_key).exists()


def test_images_of_several_namespaces_and_of_ttl_states(tmp_path: Path) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    ttl = ValueStateDescriptor("count", pa.int64(), default=0, ttl=TtlConfig(3_600_000))
    expected = _write(root, copies, [ttl], namespaces=True)
    for on_demand in (False, True):
        st = _check(root, copies, [ttl], expected, on_demand=on_demand)
        assert st.image_hits > 0 and st.misses == 0, st


def test_a_state_of_string_keys_restores_from_the_file_copies(tmp_path: Path) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    with statelog.open(root, max_parallelism=8, local_copies={"directory": str(copies)}) as job:
        b = job.backend("op")
        s = b.get_state(NAME)
        for k in range(100):
            b.set_current_key(f"k{k}")
            s.update(f"v{k}")
        materialize(job.store, job.checkpoint())
    assert not list(copies.rglob("*" + IMAGE_SUFFIX))
    with statelog.open(root, create=False, writer_lease=False, local_copies={"directory": str(copies)}) as job:
        b = job.backend("op", restore="latest", changelog=False)
        b.set_current_key("k42")
        assert b.get_state(NAME).value() == "v42"
        assert job.local_copies is not None and job.local_copies.stats.misses == 0


@pytest.mark.parametrize("how", ["flip", "truncate", "swap"])
def test_a_damaged_image_is_dropped_logged_and_the_file_read(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, copies = (tmp_path / "root").as_uri(), tmp_path / "copies"
    expected = _write(root, copies, [COUNT])
    images = sorted(copies.rglob("*" + IMAGE_SUFFIX))
    assert len(images) >= 2
    for i, p in enumerate(images):
        data = p.read_bytes()
        if how == "flip":
            j = len(data) // 2
            p.write_bytes(data[:j] + bytes([data[j] ^ 1]) + data[j + 1 :])
        elif how == "truncate":
            p.write_bytes(data[: len(data) // 3])
        else:  # another file's image, its record made consistent: only the source check stops it
            other = images[(i + 1) % len(images)].read_bytes() if i == 0 else None
            if other is not None:
                p.write_bytes(other)
                side = p.with_name(p.name + ".copy")
                side.write_text(f"{len(other)} {zlib.crc32(other)}")
    for on_demand in (False, True):
        caplog.clear()
        st = _check(root, copies, [COUNT], expected, on_demand=on_demand)
        if on_demand is False:
            assert st.dropped >= 1 and "dropped the local copy" in caplog.text, st
    # the dropped images are gone; the table files' copies serve the restores
    st = _check(root, copies, [COUNT], expected, on_demand=False)
    assert st.dropped == 0 and st.misses == 0
