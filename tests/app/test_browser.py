"""One real browser: `streamlit run app.py`, Debian's Chromium through playwright, press Run, see the diagram.

The screenshot lands in artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.app.wire import HANG_MS, serve

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
sync_playwright, expect = playwright_api.sync_playwright, playwright_api.expect
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def server():
    with serve() as url:
        yield url


def _title(page, words: str):
    """A figure's title that reads ``words`` (a regular expression): a title wraps into lines (SVG tspans), whose
    text runs together without the space at the break."""
    return page.locator("svg text.gtitle").filter(has_text=re.compile(words)).first


def test_press_run_and_see_the_diagram(server):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 1400})
            page.goto(f"{server}/?seq=128&repeats=1&warmup=1&n=2")
            run = page.get_by_role("button", name="Run", exact=True)
            run.wait_for(timeout=HANG_MS)
            _title(page, r"planned \(press\s*Run\s*to\s*observe").wait_for(timeout=HANG_MS)
            run.click()
            _title(page, r"what\s*the\s*step\s*did").wait_for(timeout=HANG_MS)
            page.get_by_text("Peak reached in:").wait_for(timeout=HANG_MS)
            # The planned chart of the previous script run lingers (stale) until this run finishes.
            expect(page.locator(".stPlotlyChart")).to_have_count(
                3, timeout=HANG_MS
            )  # diagram, where the memory goes, comparison
            expect(page.locator("svg text").filter(has_text=re.compile(r"^L3")).first).to_be_visible()  # a box
            assert not page.locator(".stException").count()
            page.wait_for_timeout(1000)  # let Plotly finish its transitions before the picture
            page.screenshot(path=str(ROOT / "artifacts" / "browser-lab.png"))
        finally:
            browser.close()


def test_cancel_stops_a_run_in_flight(server):
    """A long run (tiny-llama, 2048 tokens x 4, 20 timed steps: minutes on 2 cores), cancelled from the page."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 1400})
            page.goto(f"{server}/?seq=2048&batch=4&repeats=20&warmup=0&n=1")
            run = page.get_by_role("button", name="Run", exact=True)
            run.wait_for(timeout=HANG_MS)
            _title(page, r"planned \(press\s*Run\s*to\s*observe").wait_for(timeout=HANG_MS)
            run.click()
            page.get_by_text("timed step 1 of 20").first.wait_for(timeout=HANG_MS)  # the run is in flight
            page.get_by_role("button", name="Cancel", exact=True).click()
            page.get_by_text("Run cancelled").wait_for(timeout=HANG_MS)
            assert not page.get_by_text("Peak reached in:").count()  # nothing was measured
            assert not page.locator(".stException").count()
        finally:
            browser.close()
