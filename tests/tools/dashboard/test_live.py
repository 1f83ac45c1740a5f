"""What the dashboard shows beyond the retained checkpoints (tools/dashboard/live.py) and the
figures that misled: the history's timeline, the daemon's state, unstacked duration parts,
IEC byte axes, the materialized base named as such, one name per delay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import statelog
from materializer.daemon.loop import MaterializerDaemon
from materializer.daemon.status import StatusWriter, read_statuses
from statelog.errors import StoreError
from tests.support.dashboard_root import DemoRoot, build_demo_root
from tools.dashboard.data import gather
from tools.dashboard.figures import (
    bytes_axis,
    duration_figure,
    operator_figure,
    size_figure,
    throughput_figure,
)
from tools.dashboard.page import live_parts, render_html
from tools.roots import open_root

COUNT = statelog.ValueStateDescriptor("count", pa.int64(), default=0)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRoot:
    return build_demo_root(tmp_path_factory.mktemp("live") / "root")


@pytest.fixture(scope="module")
def data(demo: DemoRoot) -> dict[str, Any]:
    with open_root(demo.url, {}) as root:
        return gather(root)


def test_the_timeline_keeps_checkpoints_beyond_retention_and_the_failed_ones(tmp_path: Path) -> None:
    url = (tmp_path / "root").as_uri()
    with statelog.open(url, retain_checkpoints=2) as job:
        b = job.backend("op")
        for i in range(5):
            b.set_current_key(i)
            b.get_state(COUNT).update(i)
            job.checkpoint()
        real = job.catalog.store
        job.catalog.store = _RefuseCheckpoints(real)
        with pytest.raises(StoreError):
            job.checkpoint()
        job.catalog.store = real
    with open_root(url, {}) as root:
        d = gather(root)
    assert [r["checkpoint_id"] for r in d["checkpoints"]] == [4, 5]
    assert [r["checkpoint_id"] for r in d["timeline"]["completed"]] == [1, 2, 3, 4, 5]
    assert [f["checkpoint_id"] for f in d["timeline"]["failed"]] == [6]
    assert d["live"]["failed_checkpoints"] == 1 and "refused" in d["live"]["last_failure"]["reason"]
    fig = duration_figure(d)
    assert fig is not None
    by_name = {t.name: t for t in fig.data}
    assert len(by_name["sync (max over tasks)"].x) == 5 and list(by_name["failed"].x) == [d["timeline"]["failed"][0]["time"]]


class _RefuseCheckpoints:
    """A store that refuses to write checkpoint metadata (everything else goes to ``inner``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def put(self, key: str, data: bytes) -> None:
        if key.startswith("checkpoints/"):
            raise StoreError(f"refused put of {key}")
        self.inner.put(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_duration_parts_are_not_stacked_above_the_end_to_end_line() -> None:
    # the runtime's parts are maxima over tasks: 60 + 70 + 30 > 100, yet each part <= 100
    row = {"checkpoint_id": 1, "time": "2026-01-01T00:00:00.000Z", "duration_ms": 100.0, "sync_ms": 60.0,
           "async_ms": 70.0, "alignment_ms": 30.0}  # fmt: skip
    data = {"checkpoints": [row], "timeline": {"completed": [row], "failed": [], "restarts": []}}
    fig = duration_figure(data)
    assert fig is not None and fig.layout.barmode != "stack"
    assert {t.type for t in fig.data} == {"scatter"} and all(t.stackgroup is None for t in fig.data)
    total = max(t.y[0] for t in fig.data if t.name == "end to end")
    assert all(t.y[0] <= total for t in fig.data)


def test_byte_axes_use_iec_units_and_whole_numbers(data: dict[str, Any]) -> None:
    axis = bytes_axis([0, 800 * 1024**2])
    assert axis["ticktext"] == ["0 MiB", "200 MiB", "400 MiB", "600 MiB", "800 MiB", "1,000 MiB"]
    assert all(isinstance(v, int) for v in axis["tickvals"]) and "tickformat" not in axis
    assert bytes_axis([500])["ticktext"][:3] == ["0 B", "100 B", "200 B"]
    for build in (size_figure, operator_figure):
        fig = build(data)
        assert fig is not None and fig.layout.yaxis.tickformat is None
        assert all(t.endswith(("B", "KiB", "MiB")) for t in fig.layout.yaxis.ticktext)
        assert all(t.hovertemplate.startswith("%{y:,d} bytes") for t in fig.data)


def test_state_and_skew_are_named_as_the_materialized_base(data: dict[str, Any]) -> None:
    # the latest checkpoint (6) builds on the materialization of checkpoint 4
    assert data["skew"]["checkpoint_id"] == 6 and data["skew"]["base_checkpoint"] == 4
    assert {o["base_checkpoint"] for o in data["operators"]} == {4}
    fig = operator_figure(data)
    assert fig is not None
    names = [t.name for t in fig.data]
    assert "clicks (base of checkpoint 4)" in names and "changelog tail (changes since the base)" in names
    page = render_html(data)
    assert "The materialization of checkpoint 4 that checkpoint 6 builds on" in page
    assert "Checkpoint 6: the rows and bytes of its base, checkpoint 4&#x27;s materialization" in page


def test_one_name_per_delay_and_the_checkpoint_age_on_the_page(data: dict[str, Any]) -> None:
    assert all("lag_checkpoints" not in r and "base_age_checkpoints" in r for r in data["checkpoints"])
    # the daemon's definition: newest checkpoint (6) against the newest materialization (of 4)
    assert data["materializer"]["materialization_lag_checkpoints"] == 2
    page = render_html(data)
    assert "latest checkpoint age" in page and "checkpoint age" in page
    assert "materialization lag" in page and "Base age" in page and ">lag<" not in page


def test_the_daemon_state_comes_from_its_lease_and_status_object(demo: DemoRoot, tmp_path: Path) -> None:
    with statelog.open(demo.url) as job:
        daemon = MaterializerDaemon(job.store, owner="live-test", run_gc=False)
        assert daemon.run_once(force=True)["action"] == "materialized"
        daemon.stop()
        writer = StatusWriter(job.store, "other-daemon")
        writer.cycle_done(3, {"action": "none"}, StoreError("the store answered 503"))
        statuses, errors = read_statuses(job.store)
    assert errors == [] and {s["owner"] for s in statuses} == {"live-test", "other-daemon"}
    with open_root(demo.url, {}) as root:
        d = gather(root)
    mat = d["materializer"]
    assert mat["lease"]["owner"] == "live-test" and mat["lease"]["state"] == "held"
    assert mat["materialization_lag_checkpoints"] == 0
    by_owner = {s["owner"]: s for s in mat["daemons"]}
    assert by_owner["live-test"]["last_cycle"]["action"] == "materialized" and by_owner["live-test"]["last_error"] is None
    assert by_owner["other-daemon"]["last_error"] == "StoreError: the store answered 503"
    head = live_parts(d)["parts"]["part-head"]
    assert "daemon live-test" in head and "StoreError: the store answered 503" in head


def test_a_consumer_loop_shows_its_records_lag_and_watermark(tmp_path: Path) -> None:
    """A consumer loop on statelog.open() reports through job.metrics; the history carries it to
    the live table and the throughput chart, as the runtime's figures."""
    url = (tmp_path / "root").as_uri()
    with statelog.open(url) as job:
        b = job.backend("op")
        for i in range(3):
            b.set_current_key(i)
            b.get_state(COUNT).update(i)
            job.metrics.records_in(1000)
            job.metrics.records_out(10)
            job.metrics.watermark(1_700_000_000_000 + i)
            job.metrics.kafka_lag("clicks", 0, 5 - i)
            job.checkpoint()
    with open_root(url, {}) as root:
        d = gather(root)
    live = d["live"]
    assert (live["records"], live["records_out"], live["kafka_lag"], live["watermark_ms"]) == (
        3000, 30, 3, 1_700_000_000_002)
    assert live["throughput_of"] == "source records" and live["throughput_per_s"] > 0
    fig = throughput_figure(d)
    assert fig is not None
    rate = {t.name: t for t in fig.data}["source records per second"]
    assert len(rate.x) == 3 and all(y > 0 for y in rate.y[1:])
    html = live_parts(d)
    assert "records out" in str(html) and "Kafka lag" in str(html)
