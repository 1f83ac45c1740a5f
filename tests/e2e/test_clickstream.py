"""The clickstream demo end to end, as ``make demo`` runs it, on a smaller input.

A parallel runtime job loses a worker (SIGKILL) once half of its input is checkpointed; the
committed outputs must equal the plain-Python expectation exactly once, and Spark SQL over
the state at two checkpoints must equal the counts implied by their source positions. Then
``statelog ui`` serves the demo's root and headless Chromium (Debian's ``chromium``, driven by
Playwright) must find every chart of the dashboard drawn with data.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from tools.dashboard.page import CHARTS

PROJECT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("clickstream")  # both tests share the one demo run


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("clickstream")
    proc = subprocess.run(
        [
            sys.executable, "-m", "examples.clickstream", "--json", "--events", "60000",
            "--users", "800", "--rate", "12000", "--materialize-every", "1", "--dir", str(base),
        ],  # fmt: skip
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}); stderr:\n{proc.stderr[-3000:]}"
    return {"returncode": proc.returncode, "result": json.loads(lines[-1])}


def test_clickstream_demo_kills_a_worker_and_verifies_exactly_once(demo: dict[str, Any]) -> None:
    r = demo["result"]
    assert demo["returncode"] == 0 and r["passed"], json.dumps({k: v for k, v in r.items() if k != "checkpoints_list"}, indent=1)
    assert r["kill"]["happened"] and r["kill"]["covered"] >= 0.5
    assert r["attempts"] == 2 and any("WorkerLostError" in f for f in r["failures"]), r["failures"]
    for out in r["outputs"]:
        assert out["records"] == out["expected"] > 0
        assert out["duplicates"] == out["missing"] == out["unexpected"] == 0
    assert r["manifests"], "the background materializer published nothing"
    # the finished job ends on a materialization (materialize_before_final)
    assert r["final_checkpoint_materialization"], r["manifests"]
    sql = r["spark_sql"]["checkpoints"]
    assert len(sql) == 2 and all(c["passed"] for c in sql.values())
    early, final = (sql[str(r["kill"]["after_checkpoint"])], sql[str(r["final_checkpoint"])])
    assert early["clicks"] < final["clicks"] == r["events"] == 60000
    assert "user-counts" in r["checkpoints_list"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools", *args], cwd=PROJECT, capture_output=True, text=True, timeout=120)


def _saturated_share(png: bytes) -> float:
    """The share of pixels drawn in a saturated colour: plotted bars, lines, markers and heat-map
    cells are; the page's background, grid, axes and text (white, grey, black) are not."""
    from PIL import Image

    saturation = Image.open(BytesIO(png)).convert("RGB").convert("HSV").getchannel("S")
    hist = saturation.histogram()
    return sum(hist[80:]) / sum(hist)


def test_the_dashboard_draws_every_chart_on_the_demo_root(demo: dict[str, Any]) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("STATELOG_BROWSER_REQUIRED"):
            pytest.fail("chromium is not on PATH although `make test` should have installed it (apt-get install chromium)")
        pytest.skip("chromium is not on PATH: `make test` installs it (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    root = demo["result"]["root"]
    final = demo["result"]["final_checkpoint"]
    created = _cli("savepoint", "create", root, "--checkpoint", str(final), "--name", "after-demo")
    assert created.returncode == 0, created.stderr
    server = subprocess.Popen(
        [sys.executable, "-m", "tools", "ui", root, "--port", "0"],
        cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline() if server.stdout else ""
        found = re.search(r" at (http://127\.0\.0\.1:\d+/) ", line)
        assert found, f"no URL printed: {line!r}; stderr: {server.stderr.read() if server.poll() is not None and server.stderr else ''}"
        url = found.group(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync", "--no-first-run"],
            )  # fmt: skip
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                requested: list[str] = []
                page.on("request", lambda req: requested.append(req.url))
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(url, wait_until="load", timeout=60_000)
                assert page.title() == f"statelog: {root}"
                assert page.locator(".no-data").count() == 0, page.locator(".no-data").all_inner_texts()
                drawn = {}
                for name in CHARTS:
                    plot = f"#plot-{name}"
                    page.wait_for_selector(f"{plot} .main-svg", timeout=30_000)
                    # plotly keeps the figure's traces on the div: every trace holds data points
                    points = page.evaluate(
                        "id => document.getElementById(id).data.map(t => (t.z || t.y || t.x || []).length)", f"plot-{name}"
                    )
                    assert points and all(n > 0 for n in points), (name, points)
                    shot = page.locator(plot).screenshot()
                    drawn[name] = _saturated_share(shot)
                # every chart has coloured marks on it (an empty plotly chart, axes only, measured 0.0003;
                # the history's line charts over time 0.015-0.03, bars and areas more)
                assert all(share > 0.004 for share in drawn.values()), drawn
                assert page.locator("#chart-savepoints").inner_text().count("after-demo") >= 1
                assert not errors, errors
                assert all(u.startswith(url) or u.startswith("data:") for u in requested), requested
            finally:
                browser.close()
        data = json.loads(_cli("ui", root, "--json").stdout)
        assert data["counts"]["latest_checkpoint"] == final and data["materializations"]
    finally:
        server.terminate()
        server.wait(10)
