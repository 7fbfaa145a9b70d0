"""A link to a page, opened as the very first request to a new server, still gets the app around it.

Before app.py has ever run, Streamlit serves a pages/ folder in its older mode and runs the
page alone (no navigation, no language selector); each page leaves that mode and reruns.
"""

from __future__ import annotations

import pytest

from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, expect, server, sync_playwright
from tests.app.wire import HANG_MS

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

__all__ = ["server"]


def test_a_deep_link_on_a_fresh_server_runs_through_app_py(server):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(f"{server}/at_scale?lang=ja", timeout=HANG_MS)
            sidebar = page.locator("section[data-testid='stSidebar']")
            expect(sidebar.get_by_text("Language · Idioma · 言語")).to_be_visible(timeout=HANG_MS)
            expect(sidebar.get_by_text("at scale", exact=True)).to_have_count(0)  # no pages/ file-name entries
        finally:
            browser.close()
