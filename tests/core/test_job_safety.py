"""Job-root safety of the library entry point (issue 11): checkpoint `sources` keep their
JSON types, a lost job descriptor is never silently recreated, a restore without `restore=`
on a root with checkpoints is refused, and the errors name what they looked for."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import statelog
from statelog import ValueStateDescriptor
from statelog.catalog import checkpoint_key
from statelog.checkpoint import CheckpointMetadata
from statelog.errors import SerializationError

COUNT = ValueStateDescriptor("count", pa.int64(), default=0)


def _root(tmp_path: Path) -> str:
    return (tmp_path / "root").as_uri()


def _one_checkpoint(root: str, sources: dict | None = None, **kwargs: object) -> CheckpointMetadata:
    with statelog.open(root, **kwargs) as job:
        b = job.backend("counter")
        counts = b.get_state(COUNT)
        for user in ("a", "b", "a"):
            b.set_current_key(user)
            counts.update(counts.value() + 1)
        return job.checkpoint(sources=sources or {"events": 3})


# -- point 5: sources keep their JSON types --------------------------------------------------


def test_sources_keep_int_keys_and_json_types(tmp_path: Path) -> None:
    root = _root(tmp_path)
    sources = {
        "clicks": {0: 5, 1: 7},
        "mixed": {"a": [1, 2.5, None, True], 3: {"nested": {10: "x"}}},
        "flags": {True: 1, None: 2, 1.5: 3},
        "$pairs": {"$pairs": 1},
    }
    _one_checkpoint(root, sources)
    with statelog.open(root) as job:
        restored = job.latest_checkpoint()
        assert restored is not None
        assert restored.sources == sources
        assert restored.sources["clicks"][0] == 5
        assert list(restored.sources["clicks"]) == [0, 1]


def test_sources_with_str_keys_are_stored_as_before(tmp_path: Path) -> None:
    root = _root(tmp_path)
    _one_checkpoint(root, {"events": {"p0": 3}})
    data = json.loads((tmp_path / "root" / checkpoint_key(1)).read_bytes())
    assert data["body"]["sources"] == {"events": {"p0": 3}}
    assert data["body"]["version"] == 2  # readable by older builds


def test_old_metadata_without_encoded_sources_still_reads(tmp_path: Path) -> None:
    root = _root(tmp_path)
    meta = _one_checkpoint(root, {"events": {"0": 3}})
    assert meta.sources == {"events": {"0": 3}}
    with statelog.open(root) as job:
        assert job.load_checkpoint(1).sources == {"events": {"0": 3}}


@pytest.mark.parametrize(
    ("sources", "where"),
    [
        ({"clicks": {0: {1, 2}}}, "sources['clicks'][0]"),
        ({"clicks": {(0, 1): 5}}, "sources['clicks']"),
        ({"clicks": [b"x"]}, "sources['clicks'][0]"),
        ({"clicks": float("nan")}, "sources['clicks']"),
    ],
)
def test_non_json_sources_are_refused_naming_the_entry(tmp_path: Path, sources: dict, where: str) -> None:
    root = _root(tmp_path)
    with statelog.open(root) as job:
        b = job.backend("counter")
        b.set_current_key("a")
        b.get_state(COUNT).update(1)
        with pytest.raises(SerializationError) as err:
            job.checkpoint(sources=sources)
        assert "sources" in str(err.value) and where in str(err.value)
        assert job.catalog.checkpoint_ids() == []  # nothing published
