"""The data behind `statelog ui` (tools/dashboard/data.py) and the command's files and errors.

The root is built with statelog.open (tests/support/dashboard_root.py): two operators, six
checkpoints, materializations of checkpoints 2 and 4, savepoints of 3 and 6. Every figure is
checked against the metadata, manifests and state the test wrote, not recomputed the same way.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.layout import checkpoint_key
from statelog.store import open_store
from tests.support.dashboard_root import (
    CLICKS,
    MAXP,
    SAVEPOINTS,
    DemoRoot,
    build_demo_root,
    rows_per_key_group,
)
from tools.cli import main
from tools.dashboard.data import gather
from tools.dashboard.page import CHARTS, render_html
from tools.roots import open_root


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRoot:
    return build_demo_root(tmp_path_factory.mktemp("dashboard") / "root")


@pytest.fixture(scope="module")
def data(demo: DemoRoot) -> dict[str, Any]:
    with open_root(demo.url, {}) as root:
        return gather(root)


def test_checkpoint_history_has_the_recorded_stats_and_referenced_sizes(demo: DemoRoot, data: dict[str, Any]) -> None:
    rows = {r["checkpoint_id"]: r for r in data["checkpoints"]}
    assert list(rows) == [1, 2, 3, 4, 5, 6]
    for cid, meta in demo.metas.items():
        r = rows[cid]
        assert r["timestamp_ms"] == meta.timestamp_ms
        assert (r["sync_ms"], r["async_ms"], r["incremental_bytes"]) == (
            meta.stats["sync_ms"], meta.stats["async_ms"], meta.stats["incremental_bytes"]
        )
        # StateJob.checkpoint measures no end-to-end duration and has no barriers to align
        assert r["duration_ms"] is None and r["alignment_ms"] is None
        # one writer, one subtask per stream: the metadata's own sum counts each block once
        assert r["changelog_bytes"] == meta.changelog_bytes > 0
        assert r["full_bytes"] == r["changelog_bytes"] + r["materialized_bytes"]
    # checkpoints 1 and 2 build on no materialization; 3, 4 on that of 2; 5, 6 on that of 4
    assert [rows[c]["materialized_checkpoint"] for c in rows] == [None, None, 2, 2, 4, 4]
    assert [rows[c]["base_age_checkpoints"] for c in rows] == [None, None, 1, 2, 1, 2]
    assert rows[3]["base_age_ms"] == demo.metas[3].timestamp_ms - demo.metas[2].timestamp_ms
    assert rows[1]["materialized_bytes"] == rows[2]["materialized_bytes"] == 0
    for cid, base in ((3, 2), (4, 2), (5, 4), (6, 4)):  # every key group: every file of the manifest
        assert rows[cid]["materialized_bytes"] == demo.manifests[base].bytes
    # the saw-tooth: the tail grows, drops when the materialization is adopted, grows again
    tail = [rows[c]["changelog_bytes"] for c in rows]
    assert tail[0] < tail[1] > tail[2] < tail[3] > tail[4] < tail[5]


def test_materializations_operators_and_savepoints(demo: DemoRoot, data: dict[str, Any]) -> None:
    ms = data["materializations"]
    assert [(m["checkpoint_id"], m["manifest"]) for m in ms] == [(c, demo.manifests[c].key) for c in (2, 4)]
    for m in ms:
        manifest = demo.manifests[m["checkpoint_id"]]
        assert (m["rows"], m["bytes"], m["created_ms"]) == (manifest.rows, manifest.bytes, manifest.created_ms)
        assert m["published_after_ms"] == manifest.created_ms - demo.metas[m["checkpoint_id"]].timestamp_ms
    ops = {o["operator"]: o for o in data["operators"]}
    assert set(ops) == {"user-counts", "clicks-per-window"}
    assert (ops["user-counts"]["parallelism"], ops["clicks-per-window"]["parallelism"]) == (2, 1)
    states = {s["state"]: s for s in ops["user-counts"]["states"]}
    # the latest checkpoint (6) builds on the materialization of checkpoint 4: a row per user then
    assert states["clicks"]["rows"] == len(demo.users[4])
    assert {s["state"]: s["rows"] for s in ops["clicks-per-window"]["states"]}["count"] == len(demo.windows[4])
    manifest = demo.manifests[4]
    for uid, op in ops.items():
        assert op["materialized_bytes"] == manifest.operators[uid].bytes
        assert op["changelog_bytes"] == demo.metas[6].operators[uid].changelog_bytes > 0
    assert {s["name"]: s["checkpoint_id"] for s in data["savepoints"]} == SAVEPOINTS
    assert data["counts"] == {
        "checkpoints": 6, "unreadable_checkpoints": 0, "materializations": 2, "savepoints": 2,
        "latest_checkpoint": 6, "latest_checkpoint_age_ms": data["counts"]["latest_checkpoint_age_ms"],
    }  # fmt: skip


def test_key_group_skew_counts_rows_per_key_group(demo: DemoRoot, data: dict[str, Any]) -> None:
    skew = data["skew"]
    assert (skew["checkpoint_id"], skew["max_parallelism"], skew["granularity"]) == (6, MAXP, "key group")
    series = {(s["operator"], s["state"]): s["rows"] for s in skew["series"]}
    assert series[("user-counts", "clicks")] == rows_per_key_group(demo.users[4])
    assert series[("clicks-per-window", "count")] == rows_per_key_group(demo.windows[4])
    # over the byte budget: each file's rows spread over its key groups, same totals per file
    with open_root(demo.url, {}) as root:
        coarse = gather(root, skew_scan_bytes=0)["skew"]
    assert coarse["granularity"] == "table file"
    for s in coarse["series"]:
        exact = series[(s["operator"], s["state"])]
        assert sum(s["rows"]) == pytest.approx(sum(exact))
        assert all(isinstance(v, float | int) for v in s["rows"])
    files = demo.manifests[4].operators["user-counts"].files["clicks"]
    assert len(files) > 1  # several files: the coarse counts differ between their ranges
    coarse_clicks = next(s["rows"] for s in coarse["series"] if s["state"] == "clicks")
    for f in files:
        part = coarse_clicks[f.key_groups.start : f.key_groups.end + 1]
        assert sum(part) == pytest.approx(f.rows) and max(part) == pytest.approx(min(part))


def test_notes_say_what_is_not_recorded(data: dict[str, Any]) -> None:
    notes = "\n".join(data["notes"])
    assert "duration_ms is not recorded in the metadata of any retained checkpoint" in notes
    assert "alignment_ms is not recorded" in notes
    assert "no checkpoint history" not in notes  # the demo's publisher wrote one
    assert data["summary"]["duration_ms"]["max"] > 0  # from the recorded sync + async parts


def test_a_root_with_checkpoints_but_no_materialization_has_no_skew(tmp_path: Path) -> None:
    url = (tmp_path / "root").as_uri()
    with statelog.open(url, max_parallelism=MAXP) as job:
        b = job.backend("op")
        b.set_current_key("k")
        b.get_state(CLICKS).update(1)
        job.checkpoint()
    with open_root(url, {}) as root:
        d = gather(root)
    assert d["skew"]["series"] == [] and d["materializations"] == [] and d["savepoints"] == []
    assert any("key-group skew needs a materialization" in n for n in d["notes"])
    page = render_html(d)
    # one checkpoint: no state changes since an earlier one of this process, so no throughput yet
    for name in ("key-group-skew", "base-age", "savepoints", "checkpoint-throughput"):
        assert f'id="plot-{name}"' not in page and f'<section class="chart" id="chart-{name}">' in page
    assert page.count('class="no-data"') == 4
    assert 'id="plot-checkpoint-duration"' in page


def test_a_corrupt_checkpoint_is_reported_not_fatal(tmp_path: Path, demo: DemoRoot) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(Path(demo.url.removeprefix("file://")), copy)
    (copy / checkpoint_key(5)).write_bytes(b"{not json")
    with open_root(copy.as_uri(), {}) as root:
        d = gather(root)
    assert [r["checkpoint_id"] for r in d["checkpoints"]] == [1, 2, 3, 4, 6]
    assert [r["checkpoint_id"] for r in d["unreadable_checkpoints"]] == [5]
    assert any(n.startswith("checkpoint 5 could not be read") and checkpoint_key(5) in n for n in d["notes"])


# -- the command ---------------------------------------------------------------------------------


def test_ui_json_prints_the_gathered_data(demo: DemoRoot, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui", demo.url, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["checkpoint_id"] for r in printed["checkpoints"]] == [1, 2, 3, 4, 5, 6]
    strip = ("generated_ms", "generated", "counts", "live", "materializer")  # ages: as of the call
    assert {k: v for k, v in printed.items() if k not in strip} == {k: v for k, v in data.items() if k not in strip}


def test_ui_out_writes_one_self_contained_page(demo: DemoRoot, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["ui", demo.url, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    page = out.read_text()
    assert "<script src" not in page and "<link" not in page  # nothing loaded from elsewhere
    assert page.count("<script") == 1 + len(CHARTS)  # plotly.js inlined once, one per chart
    assert len(page) > 3_000_000  # plotly.js itself is a few MB
    for name in CHARTS:
        assert f'<div id="plot-{name}"' in page, name
    assert "before-upgrade" in page and "nightly" in page


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_ui_user_errors_exit_2_with_one_line(demo: DemoRoot, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui", (tmp_path / "nothing").as_uri(), "--out", str(tmp_path / "r.html")]) == 2
    assert "is not a statelog job root" in _one_error_line(capsys)
    assert not (tmp_path / "r.html").exists()
    assert main(["ui", demo.url, "--out", str(tmp_path / "missing-dir" / "r.html")]) == 2
    assert "--out: cannot write" in _one_error_line(capsys)
    for port in ("70000", "http", "-1"):
        assert main(["ui", demo.url, "--port", port]) == 2
        assert "--port: expected a TCP port 0..65535" in _one_error_line(capsys)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", demo.url, "--port", str(port)]) == 2
        assert f"cannot serve on 127.0.0.1:{port}" in _one_error_line(capsys)


def test_the_root_is_only_read(demo: DemoRoot, tmp_path: Path) -> None:
    store = open_store(demo.url)
    try:
        before = {o.key: (o.size, o.mtime) for o in store.list("")}
    finally:
        store.close()
    assert main(["ui", demo.url, "--out", str(tmp_path / "r.html")]) == 0
    store = open_store(demo.url)
    try:
        assert {o.key: (o.size, o.mtime) for o in store.list("")} == before
    finally:
        store.close()
