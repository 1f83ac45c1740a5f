"""``statelog ui`` in Debian's Chromium (driven by Playwright): the served page updates itself
while a job checkpoints, and it fits a 400 px and a 1400 px wide window.

The root is the dashboard's demo root (tests/support/dashboard_root.py) plus a cycle of the
materializer daemon (its lease and status object); the page is served by the command itself
(``python -m tools ui ROOT --port 0 --refresh 1``) and read back from the browser: plotly's
traces, the page's layout boxes, and the pixels of full-page screenshots.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from PIL import Image

import statelog
from materializer.daemon.loop import MaterializerDaemon
from tests.support.dashboard_root import MAXP, build_demo_root
from tools.dashboard.page import CHARTS

PROJECT = Path(__file__).resolve().parents[3]
LIVE = statelog.ValueStateDescriptor("live", pa.int64(), default=0)
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def _chromium() -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("STATELOG_BROWSER_REQUIRED"):
            pytest.fail("chromium is not on PATH although `make test` should have installed it (apt-get install chromium)")
        pytest.skip("chromium is not on PATH: `make test` installs it (apt-get install -y chromium)")
    return chromium


def _root(base: Path) -> str:
    demo = build_demo_root(base / "root")
    with statelog.open(demo.url) as job:
        daemon = MaterializerDaemon(job.store, owner="dashboard-test", run_gc=False)
        assert daemon.run_once(force=True)["action"] == "materialized"
        daemon.stop()
    return demo.url


@contextlib.contextmanager
def _serve(root: str) -> Iterator[str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tools", "ui", root, "--port", "0", "--refresh", "1"],
        cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline() if server.stdout else ""
        found = re.search(r" at (http://127\.0\.0\.1:\d+/) ", line)
        assert found, f"no URL printed: {line!r}"
        yield found.group(1)
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The root the live test checkpoints into."""
    return _root(tmp_path_factory.mktemp("live"))


@pytest.fixture(scope="module")
def served(root: str) -> Iterator[str]:
    with _serve(root) as url:
        yield url


@pytest.fixture(scope="module")
def served_unchanged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A root no test writes to: every chart has data."""
    with _serve(_root(tmp_path_factory.mktemp("layout"))) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        try:
            yield b
        finally:
            b.close()


def _points(page: Any, name: str) -> list[int]:
    return page.evaluate(
        "id => { const d = document.getElementById(id); return d && d.data ? d.data.map(t => (t.x || []).length) : []; }",
        f"plot-{name}",
    )


def test_the_page_updates_while_the_job_checkpoints(root: str, served: str, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(served, wait_until="load", timeout=60_000)
    page.wait_for_selector("#plot-checkpoint-duration .main-svg", timeout=30_000)
    page.evaluate("window.notReloaded = true")  # gone if the page were loaded again
    before = _points(page, "checkpoint-duration")
    assert before and max(before) == 6  # the demo's six checkpoints, from the checkpoint history
    head = page.locator("#part-head").inner_text()
    assert "dashboard-test" in head and "last cycle" in head and "materialization lag" in head
    assert "latest checkpoint age" in head
    with statelog.open(root, max_parallelism=MAXP) as job:
        b = job.backend("live-op")
        for k in range(20):
            b.set_current_key(k)
            b.get_state(LIVE).update(k)
        new = job.checkpoint().checkpoint_id
        # the new checkpoint appears without a reload: in the duration chart and the live table
        page.wait_for_function(
            "n => { const d = document.getElementById('plot-checkpoint-duration');"
            " return d && d.data && d.data[0].x.length >= n; }",
            arg=max(before) + 1, timeout=30_000,
        )  # fmt: skip
        page.wait_for_function(
            "cid => document.querySelector('#part-head table.live').innerText.includes('latest checkpoint\\t' + cid)",
            arg=str(new), timeout=30_000,
        )  # fmt: skip
    assert page.evaluate("window.notReloaded") is True
    assert "update failed" not in page.locator("#live-status").inner_text()
    assert not errors, errors
    page.close()


def _saturated_share(img: Image.Image) -> float:
    hist = img.convert("RGB").convert("HSV").getchannel("S").histogram()
    return sum(hist[80:]) / sum(hist)


@pytest.mark.parametrize("width", [400, 1400])
def test_the_page_fits_the_window(served_unchanged: str, browser: Any, width: int) -> None:
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(served_unchanged, wait_until="load", timeout=60_000)
    assert page.locator(".no-data").count() == 0
    for name in CHARTS:
        page.wait_for_selector(f"#plot-{name} .main-svg", timeout=30_000)
    # nothing wider than the window: the document does not scroll sideways, no box sticks out
    layout = page.evaluate(
        """() => ({doc: document.documentElement.scrollWidth, inner: window.innerWidth,
                  out: [...document.querySelectorAll('body *')].filter(e => {
                      const r = e.getBoundingClientRect();
                      return r.width > 0 && (r.right > window.innerWidth + 0.5 || r.left < -0.5)
                          && !(e.parentElement && e.parentElement.closest('.scroll'))  // tables scroll in their box
                          && !e.closest('#js-plotly-tester');  // plotly's off-screen text measurer
                  }).map(e => e.tagName + '#' + e.id + '.' + e.className).slice(0, 10)})"""
    )
    assert layout["doc"] == layout["inner"] == width, layout
    assert layout["out"] == [], layout
    # the pixels: a full-page screenshot is exactly the window wide, and every chart inside it
    # has drawn marks (an empty plotly chart, axes only, has almost no saturated pixels)
    png = page.screenshot(full_page=True)
    if os.environ.get("STATELOG_SCREENSHOTS"):  # a directory to keep the screenshots in
        (Path(os.environ["STATELOG_SCREENSHOTS"]) / f"ui-{width}.png").write_bytes(png)
    shot = Image.open(BytesIO(png))
    assert shot.width == width
    drawn = {}
    for name in CHARTS:
        box = page.locator(f"#plot-{name}").bounding_box()
        assert box is not None, name
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, (name, box)
        crop = shot.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
        drawn[name] = _saturated_share(crop)
    # (an empty plotly chart measured 0.0003 in tests/e2e/test_clickstream.py; thin lines ~0.01)
    assert len(drawn) == len(CHARTS) and all(v > 0.004 for v in drawn.values()), drawn
    page.close()
