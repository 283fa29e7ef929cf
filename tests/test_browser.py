"""Real browser (Playwright + Debian's Chromium, headless): click an example, watch the answer, check the figures.

Saves a screenshot to $TR_SCREENSHOT if set (e.g. assets/screenshot.png), else to pytest's tmp dir.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from conftest_app import running_app

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("TR_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")


def test_example_click_streams_answer_and_draws_tree_heatmap_and_meter(tmp_path):
    shot = Path(os.environ.get("TR_SCREENSHOT") or tmp_path / "screenshot.png")
    with running_app() as url, playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
            page.goto(url, wait_until="load", timeout=60_000)
            page.wait_for_selector("#tr-examples", timeout=60_000)
            # fewer tokens keep the test short on a CPU; the example button itself is what a visitor clicks
            page.locator("#tr-examples").get_by_text("Translation", exact=True).click()
            # streaming: the answer and the live tree appear before the run ends
            page.wait_for_selector("#tr-chat .message.bot span.tr-run-a, #tr-chat [data-testid='bot'] span.tr-run-a",
                                   timeout=240_000)
            page.wait_for_function(
                "() => { const r = document.querySelector('#tr-meter .tr-biglabel');"
                " return r && r.textContent.includes('measured'); }", timeout=300_000)
            ratio = page.locator("#tr-ratio").inner_text()
            tps = page.locator("#tr-tps").inner_text()
            assert re.fullmatch(r"\d+\.\d\d×", ratio), ratio
            assert float(tps) > 0
            assert "token-identical" in page.locator("#tr-meter").inner_text()
            # plotly drew SVG: tree markers (one per node; the default tree's size depends on the device) and heatmap
            page.wait_for_function("() => document.querySelectorAll('#tr-tree .scatterlayer .point').length >= 2",
                                   timeout=30_000)
            assert "accepted" in page.locator("#tr-tree .gtitle").text_content()
            assert page.locator("#tr-tree svg.main-svg").count() >= 1
            assert page.locator("#tr-heat svg.main-svg").count() >= 1
            assert page.locator("#tr-heat .hm, #tr-heat image, #tr-heat .heatmaplayer").count() >= 1
            assert page.locator("#tr-chart .bars .point").count() >= 1
            answer = page.locator("#tr-chat").inner_text()
            assert len(answer.strip()) > 20
            page.wait_for_timeout(500)
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
