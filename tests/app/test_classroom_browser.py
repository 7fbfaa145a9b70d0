"""The instructor's room in real browsers: the participant's page follows the round by its fragment's timer alone.

AppTest does not run a fragment's timer, so this is checked with `streamlit run app.py` on
127.0.0.1 and Debian's Chromium through playwright (as tests/app/test_browser.py): the
participant never reloads; the round appearing, the count rising on the instructor's page and
the room's result appearing all come from the pages asking the room every few seconds. The
screenshots land in artifacts/ for a person to look at.
"""

from __future__ import annotations

import os

import pytest

from ckptlab.show import i18n
from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, serve
from tests.app.wire import HANG_MS

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]

SECRET = "kingfisher at dawn"


def test_a_participant_follows_the_round_without_reloading():
    with (
        serve("streamlit-classroom-test.log", {"CKPTLAB_INSTRUCTOR_SECRET": SECRET}) as url,
        playwright_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            participant = browser.new_context().new_page()
            participant.set_viewport_size({"width": 1366, "height": 1400})
            participant.goto(f"{url}/?lang=pt-BR")
            participant.get_by_text("Preveja, depois meça").first.click()
            participant.get_by_text("Sua pontuação").wait_for(timeout=HANG_MS)

            teacher = browser.new_context().new_page()
            teacher.set_viewport_size({"width": 1366, "height": 1400})
            teacher.goto(url)
            teacher.get_by_text("Instructor's room").first.click()
            phrase = teacher.get_by_label("Instructor's phrase")
            phrase.fill(SECRET)
            phrase.press("Enter")
            teacher.get_by_role("button", name="Measure and open the round").click(timeout=HANG_MS)
            teacher.get_by_role("button", name="Close the round and show the answers").wait_for(timeout=HANG_MS)

            participant.get_by_text("Rodada 1 da sala").wait_for(timeout=HANG_MS)  # no reload: the timer
            participant.get_by_role("button", name="Enviar minha resposta à sala").click()
            participant.get_by_text("Sua resposta: 100").wait_for(timeout=HANG_MS)
            teacher.locator("[data-testid='stMetricValue']").get_by_text("1", exact=True).wait_for(timeout=HANG_MS)

            teacher.get_by_role("button", name="Close the round and show the answers").click()
            teacher.get_by_text("Round 1: the room's predictions beside the measurement").wait_for(timeout=HANG_MS)
            participant.get_by_text("Rodada 1: as previsões da sala ao lado da medição").wait_for(timeout=HANG_MS)
            assert not participant.locator(".stException").count() and not teacher.locator(".stException").count()
            participant.wait_for_timeout(1000)  # let Plotly finish its transitions before the picture
            participant.screenshot(path=str(ROOT / "artifacts" / "browser-classroom-participant-pt-BR.png"))
            teacher.screenshot(path=str(ROOT / "artifacts" / "browser-classroom-instructor.png"))
        finally:
            browser.close()


def test_a_new_tab_of_the_same_browser_is_the_same_participant():
    """The participant key a small script keeps in a cookie: a second tab's session reads it back, so it keeps the
    same key (a session that did not would write its own new key over it); another browser gets its own."""
    with (
        serve("streamlit-participant-key-test.log", {"CKPTLAB_INSTRUCTOR_SECRET": SECRET}) as url,
        playwright_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:

            def key_after_opening_exercises(context) -> str:
                page = context.new_page()
                page.goto(url)
                page.get_by_text("Predict, then measure").first.click()
                # Drawn after the room's part of the page, where the script that keeps the key is placed.
                page.get_by_text(i18n.t("exercises.score_title", "en")).first.wait_for(timeout=HANG_MS)
                page.wait_for_function("document.cookie.includes('ckptlab_participant=')", timeout=HANG_MS)
                page.wait_for_timeout(2000)  # a session that ignored the cookie would have written its own by now
                assert not page.locator(".stException").count()
                return next(c["value"] for c in context.cookies() if c["name"] == "ckptlab_participant")

            one = browser.new_context()
            first = key_after_opening_exercises(one)
            assert len(first) == 32 and key_after_opening_exercises(one) == first  # a new tab: the same key
            assert key_after_opening_exercises(browser.new_context()) != first  # another browser: its own
        finally:
            browser.close()
