"""The Learn pages in a real browser, in Japanese: Play moves the step-through on by itself.

AppTest does not run a fragment's timer, so the Play button is checked here, with
`streamlit run app.py` and Debian's Chromium through playwright (as tests/app/test_browser.py).
The screenshot lands in artifacts/ for a person to look at.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, server  # noqa: F401  (server is a fixture)
from tests.app.wire import HANG_MS

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


def test_play_steps_through_the_training_step_in_japanese(server):  # noqa: F811
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 1400})
            page.goto(f"{server}/?lang=ja")  # the entry point first: st.navigation takes over the URLs
            page.get_by_text("ステップごとのレッスン").first.click()
            page.get_by_text("活性化とは何か").wait_for(timeout=HANG_MS)
            page.locator("[data-testid='stButtonGroup'] button").filter(has_text="ステップ実行").click()
            page.get_by_text("1回の学習ステップをイベントごとに").wait_for(timeout=HANG_MS)
            slider = page.locator("[data-testid='stSliderThumbValue']").first
            slider.get_by_text(re.compile(r"^1/\d+ · ")).wait_for(timeout=HANG_MS)
            page.get_by_role("button", name=re.compile("再生")).click()
            # The fragment's timer moves one event every PLAY_SECONDS: after a few seconds the slider is further on.
            slider.get_by_text(re.compile(r"^([4-9]|\d\d)/\d+ · ")).wait_for(timeout=HANG_MS)
            assert page.get_by_role("button", name=re.compile("一時停止")).count() == 1
            assert "?lang=ja" in page.url or "lang=ja" in page.url
            assert not page.locator(".stException").count()
            page.screenshot(path=str(ROOT / "artifacts" / "browser-lesson-play-ja.png"))
        finally:
            browser.close()
