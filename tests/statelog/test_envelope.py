"""One checksummed, versioned JSON envelope (statelog/envelope.py) for every JSON object.

The bytes each format writes are pinned (they must not change: objects written by older
builds are read back and compared), and every reader verifies through the one codec.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from statelog import envelope
from statelog.checkpoint import lease_objects as lease
from statelog.checkpoint.catalog import JobInfo
from statelog.checkpoint.metadata import CheckpointMetadata
from statelog.errors import CorruptionError, FormatVersionError
from statelog.materialization.manifest import Manifest
from statelog.store.local import LocalObjectStore

JOB = JobInfo("5a28f194db3a486ca16feee7114d6832", 128, 1795337596232)
# the bytes of docs/format.md section 2 (written by every build since job.json v1)
JOB_BYTES = (
    b'{"body": {"created_ms": 1795337596232, "format": "statelog.job", "job_id": '
    b'"5a28f194db3a486ca16feee7114d6832", "max_parallelism": 128, "version": 1}, "crc32": 416514531}'
)
META = CheckpointMetadata(3, "j" * 32, 1000, 128, {"s": {"p0": 3}}, {})
META_BYTES = (
    b'{"body":{"checkpoint_id":3,"format":"statelog.checkpoint","job_id":"jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj",'
    b'"kind":"checkpoint","max_parallelism":128,"operators":{},"sources":{"s":{"p0":3}},"stats":{},'
    b'"timestamp_ms":1000,"version":2},"crc32":3556488940}'
)
MANIFEST = Manifest(
    "m-000000000003-000001-0a1b2c3d", "materializations/manifests/m-000000000003-000001-0a1b2c3d.json",
    3, "j" * 32, 128, 2000, 1, {},
)
MANIFEST_BYTES = (
    b'{"body":{"checkpoint_id":3,"created_ms":2000,"format":"statelog.materialization",'
    b'"id":"m-000000000003-000001-0a1b2c3d","job_id":"jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj","kind":"materialization",'
    b'"lease_generation":1,"max_parallelism":128,"operators":{},"stats":{},"version":1},"crc32":2797150292}'
)
LEASE_BODY = {"format": "statelog-lease", "version": 1, "kind": "acquire", "generation": 1, "ttl_ms": 1000,
              "owner": "t"}
LEASE_BYTES = (
    b'{"body":{"format":"statelog-lease","generation":1,"kind":"acquire","owner":"t","ttl_ms":1000,'
    b'"version":1},"crc32":2075596768}'
)


def test_every_json_format_writes_the_bytes_it_always_wrote() -> None:
    assert JOB.to_bytes() == JOB_BYTES
    assert META.to_bytes() == META_BYTES
    assert MANIFEST.to_bytes() == MANIFEST_BYTES
    assert lease._encode(LEASE_BODY) == LEASE_BYTES
    assert envelope.dump(LEASE_BODY) == LEASE_BYTES
    assert envelope.dump(json.loads(JOB_BYTES)["body"], spaced=True) == JOB_BYTES


def test_every_reader_verifies_through_the_envelope(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: list[tuple[str, str, str | None]] = []
    real = envelope.load

    def spy(data: bytes, key: str, what: str, **kw: Any) -> dict[str, Any]:
        seen.append((key, what, kw.get("fmt")))
        return real(data, key, what, **kw)

    monkeypatch.setattr(envelope, "load", spy)
    assert JobInfo.from_bytes(JOB_BYTES, "job.json") == JOB
    assert CheckpointMetadata.from_bytes(META_BYTES, "checkpoints/chk-000000000003.json") == META
    assert Manifest.from_bytes(MANIFEST_BYTES, MANIFEST.key) == MANIFEST
    store = LocalObjectStore(str(tmp_path))
    store.put(lease.generation_key("x/lease/", 1), LEASE_BYTES)
    assert lease.current_holder(store, "x/lease/")["owner"] == "t"  # type: ignore[index]
    assert seen == [
        ("job.json", "job descriptor", "statelog.job"),
        ("checkpoints/chk-000000000003.json", "checkpoint metadata", "statelog.checkpoint"),
        (MANIFEST.key, "materialization manifest", "statelog.materialization"),
        ("x/lease/gen-000000000001.json", "lease object", "statelog-lease"),
    ]


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (b"not json", CorruptionError, "is not valid JSON of the expected shape"),
        (b'{"body": [], "crc32": 0}', CorruptionError, "body is not a JSON object"),
        (JOB_BYTES.replace(b"128", b"129"), CorruptionError, "checksum mismatch"),
        (envelope.dump({"format": "statelog.other", "version": 1}), CorruptionError,
         "has format 'statelog.other', expected 'statelog.job'"),
        (envelope.dump({"format": "statelog.job", "version": 9}), FormatVersionError,
         "has format version 9, this build reads version 1; upgrade statelog"),
    ],
)
def test_a_bad_envelope_names_the_object_and_what_was_expected(data: bytes, error: type, words: str) -> None:
    with pytest.raises(error, match="job descriptor job.json") as info:
        JobInfo.from_bytes(data, "job.json")
    assert words in str(info.value) and info.value.key == "job.json"
    assert type(info.value) is error


def test_several_readable_versions_are_listed() -> None:
    data = envelope.dump({"format": "statelog.checkpoint", "version": 7})
    with pytest.raises(FormatVersionError, match=r"this build reads versions \(1, 2, 3\)"):
        CheckpointMetadata.from_bytes(data, "checkpoints/chk-000000000007.json")
