"""Every page's first line of work: make sure app.py runs around it. Not a page itself.

Opened by its URL before app.py ever ran on this server, Streamlit falls back to its older
pages/ folder mode and runs a page file alone (no app navigation, no language selector).
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager


def run_through_app() -> None:
    """On a session's first run in that mode, leave it and rerun: app.py then runs first and routes here.

    Only on the first run: a rerun would drop a button press, and later runs find the mode
    already left.
    """
    if PagesManager.uses_pages_directory and not st.session_state:
        PagesManager.uses_pages_directory = False
        st.rerun()
