"""A session of the app in AppTest: open a page as a browser would (the entry point first), and check it is alive."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300  # real measured steps on 2 shared cores; AppTest's default 3 s is far too short


def open_page(page: str, lang: str = "en", timeout: float = TIMEOUT) -> AppTest:
    """A new session on ``page`` in ``lang``: app.py runs first (its navigation and language), then the page."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params["lang"] = lang
    at.run()
    at.switch_page(page).run()
    assert_alive(at)
    return at


def assert_alive(at: AppTest) -> None:
    """No exception and no error on the page."""
    assert not at.exception, "\n".join(str(e.value) for e in at.exception)
    assert not at.error, "\n".join(str(e.value) for e in at.error)
