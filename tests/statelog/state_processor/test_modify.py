"""Modify offline: read a checkpoint with the readers, transform, write a new savepoint, also
into a new root with another max_parallelism; every state's rows survive unchanged unless edited."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import statelog
from statelog.errors import ConfigError, StateNotFoundError
from statelog.state_processor import SavepointWriter, read_state, rewrite, state_info
from tests.support.spark import jobs
from tools.roots import open_root
from tools.verify import verify_root


def _rows(job: statelog.StateJob, which: Any, uid: str, state: str) -> set[tuple]:
    meta = job.resolve_checkpoint(which)
    table = read_state(job, meta, uid, state)
    out = set()
    for r in table.to_pylist():
        r.pop("key_group")
        if "value_pickle" in r:
            r["value"] = pickle.loads(r.pop("value_pickle"))
        out.add(tuple((k, jobs.norm(v)) for k, v in sorted(r.items())))
    return out


def _verified(url: str) -> None:
    with open_root(url, {}) as root:
        report = verify_root(root)
    assert report.ok, report.faults


@pytest.mark.parametrize("max_parallelism", [jobs.MAXP, 64])
def test_unchanged_copy_has_every_row(built_file: jobs.Built, tmp_path: Path, max_parallelism: int) -> None:
    target = (tmp_path / "copy").as_uri()
    with statelog.open(built_file.root, create=False) as src, \
            SavepointWriter(target, "copy", max_parallelism=max_parallelism) as w:
        meta = rewrite(src, built_file.c3, w)
        assert (meta.checkpoint_id, meta.sources, meta.max_parallelism) == (built_file.c3, {"offset": 2}, max_parallelism)
        with statelog.open(target, create=False) as dst:
            for uid, states in [("op", jobs.STATES), ("words", ["n"])]:
                for s in states:
                    assert _rows(dst, "savepoint:copy", uid, s) == _rows(src, built_file.c3, uid, s), (uid, s)
            # and a job restores it at another parallelism
            assert jobs.restored_rows(dst, "savepoint:copy", "seen", 3) == jobs.restored_rows(src, built_file.c3, "seen", 2)
    _verified(target)


def test_edits(built_file: jobs.Built, tmp_path: Path) -> None:
    target = (tmp_path / "edit").as_uri()
    extra = state_info("flag", "value", pa.bool_())
    with statelog.open(built_file.root, create=False) as src, SavepointWriter(target, "edit", max_parallelism=16) as w:
        rewrite(src, built_file.c4, w, drop_operators=["words"], drop_states=[("op", "blob")],
                rename_operators={"op": "counter"}, casts={("op", "count"): pa.int32()},
                key_filter=lambda t: pc.fill_null(pc.invert(pc.starts_with(t["key"], "user-1")), True),
                add={("counter", "flag"): (extra, pa.table({"key": ["x"], "value": [True]}))})
        with statelog.open(target, create=False) as dst:
            meta = dst.load_savepoint("edit")
            assert sorted(meta.operators) == ["counter"]
            states = meta.operators["counter"].states
            assert "blob" not in states and states["count"].value_type == pa.int32() and "flag" in states
            count = read_state(dst, meta, "counter", "count")
            assert count.schema.field("value").type == pa.int32()
            before = {r["key"]: r["value"] for r in read_state(src, src.resolve_checkpoint(built_file.c4), "op", "count")
                      .to_pylist() if r["namespace"] is None}
            after = {r["key"]: r["value"] for r in count.to_pylist() if r["namespace"] is None}
            assert after == {k: v for k, v in before.items() if not str(k).startswith("user-1")} and after
            assert read_state(dst, meta, "counter", "flag").column("value").to_pylist() == [True]
    _verified(target)


def test_bad_edits_are_refused(built_file: jobs.Built, tmp_path: Path) -> None:
    target = (tmp_path / "bad").as_uri()
    with statelog.open(built_file.root, create=False) as src, SavepointWriter(target, "bad", max_parallelism=16) as w:
        with pytest.raises(StateNotFoundError, match="operator 'nope' does not exist in checkpoint"):
            rewrite(src, built_file.c4, w, drop_operators=["nope"])
        with pytest.raises(ConfigError, match="operator 'op', state 'total', column 'value': has type int64, the state "
                           "holds string; cast the column explicitly"):
            rewrite(src, built_file.c4, w, casts={("op", "total"): pa.string()})
