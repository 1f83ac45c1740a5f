"""``statelog verify`` names a valid object found in the place of another."""

from __future__ import annotations

import json
from typing import Any

import pytest

from materializer.savepoint import create_savepoint
from statelog.layout import checkpoint_key, savepoint_manifest_key, savepoint_metadata_key
from tests.support.gc_job import OPTIONS, Built, build, copy_over, swap_table_file
from tests.support.s3server import RootSpec
from tools.cli import main


@pytest.fixture
def built(file_root: RootSpec) -> Built:
    out = build(file_root, rounds=6, materialize_after=(2, 4))
    with file_root.open() as store:
        create_savepoint(store, 5, "sp5", options=OPTIONS)
        create_savepoint(store, 6, "sp6", options=OPTIONS)
    return out


def verify_json(spec: RootSpec, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["verify", spec.url, "--json"])
    return code, json.loads(capsys.readouterr().out)


def faulty(report: dict[str, Any]) -> set[str]:
    return {f["object"] for f in report["faults"]}


def test_verify_is_clean_before(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = verify_json(built.spec, capsys)
    assert (code, report["faults"]) == (0, [])
    assert report["manifests_checked"] == 4  # M1, M2 and both savepoints'


def test_verify_names_a_manifest_copied_over_another(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    m1, m2 = built.manifests[2].key, built.manifests[4].key
    copy_over(built.spec, m1, m2)
    code, report = verify_json(built.spec, capsys)
    assert code != 0 and not report["ok"]
    assert faulty(report) == {m2}
    [fault] = report["faults"]
    assert fault["error"] == "CorruptionError" and fault["checkpoints"] == [5, 6]
    code = main(["verify", built.spec.url])
    out, _ = capsys.readouterr()
    assert code != 0 and m2 in out


def test_verify_names_a_materialization_manifest_over_a_savepoints(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_over(built.spec, built.manifests[4].key, savepoint_manifest_key("sp6"))
    code, report = verify_json(built.spec, capsys)
    assert code != 0 and faulty(report) == {savepoint_manifest_key("sp6")}


def test_verify_names_a_savepoint_manifest_over_another_savepoints(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_over(built.spec, savepoint_manifest_key("sp5"), savepoint_manifest_key("sp6"))
    code, report = verify_json(built.spec, capsys)
    assert code != 0 and faulty(report) == {savepoint_manifest_key("sp6")}


def test_verify_names_savepoint_metadata_over_another_savepoints(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_over(built.spec, savepoint_metadata_key("sp5"), savepoint_metadata_key("sp6"))
    code, report = verify_json(built.spec, capsys)
    assert code != 0 and faulty(report) == {savepoint_metadata_key("sp6")}


def test_verify_names_a_table_file_swapped_with_another(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    path = swap_table_file(built)
    code, report = verify_json(built.spec, capsys)
    assert code != 0 and faulty(report) == {path}


def test_verify_names_checkpoint_metadata_copied_over_another(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    copy_over(built.spec, checkpoint_key(4), checkpoint_key(5))  # chk-5 <- chk-4
    code, report = verify_json(built.spec, capsys)
    assert code != 0 and faulty(report) == {checkpoint_key(5)}
