"""Every page in Japanese in a real browser (`streamlit run app.py`, Debian's Chromium through playwright).

Each page is opened with ``?lang=ja``; the test waits for the page's own heading in Japanese (from
ja.json, the one the AppTest of the page checks in English) and for its script to finish (Streamlit's
running indicator gone, no placeholder left), checks no exception box is drawn and takes a screenshot. The pictures land in ``$CKPTLAB_SCREENSHOTS`` when it is set, else in
``artifacts/screenshots-ja/`` (gitignored); the test prints where. Without a CJK font the Japanese shows as
boxes: the pictures still tell whether a page drew.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ckptlab.show import i18n
from tests.app.test_app import PAGES
from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT
from tests.app.wire import HANG_MS, serve

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
sync_playwright, expect = playwright_api.sync_playwright, playwright_api.expect
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
HEADING_TIMEOUT_MS = 180_000  # a page's first run on a fresh, busy server describes every preset


def screenshot_dir() -> Path:
    folder = Path(os.environ.get("CKPTLAB_SCREENSHOTS") or ROOT / "artifacts" / "screenshots-ja")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def url_path(page: str) -> str:
    """The page's address under st.navigation: its file's name, the Lab page (the default) at the root."""
    name = Path(page).stem
    return "" if name == "lab" else name


def test_every_page_draws_in_japanese_without_an_exception():
    folder = screenshot_dir()
    with serve("streamlit-browser-pages-ja.log") as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for page_file, (_, key) in PAGES.items():
                page = browser.new_page(viewport={"width": 1366, "height": 1400})
                page.goto(f"{server}/{url_path(page_file)}?lang=ja", timeout=HANG_MS)
                heading = i18n.t(key, "ja")
                assert heading != i18n.t(key, "en")  # the page's own words in Japanese, not English
                page.get_by_role("heading", name=heading).first.wait_for(timeout=HEADING_TIMEOUT_MS)
                # The script ran to its end: Streamlit's running indicator gone, no widget left a placeholder.
                expect(page.get_by_test_id("stStatusWidget")).to_be_hidden(timeout=HEADING_TIMEOUT_MS)
                expect(page.get_by_test_id("stSkeleton")).to_have_count(0, timeout=HEADING_TIMEOUT_MS)
                expect(page.locator(".stException")).to_have_count(0)
                address = urlsplit(page.url)  # still this page, still in Japanese
                assert address.path.strip("/") == url_path(page_file) and parse_qs(address.query)["lang"] == ["ja"]
                path = folder / f"{Path(page_file).stem}-ja.png"
                page.screenshot(path=str(path), full_page=True)
                print(f"screenshot: {path}")
                assert path.stat().st_size > 10_000  # a picture, not an empty frame
                page.close()
        finally:
            browser.close()
