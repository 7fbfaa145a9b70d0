"""Who a participant is to the device queue: the signed-in person where sign-in is on, else the browser session."""

from __future__ import annotations

import pages._server as server


class _SignedIn(dict):
    is_logged_in = True


def test_a_signed_in_person_is_one_owner_whatever_the_tab(monkeypatch):
    monkeypatch.setattr(server.st, "user", _SignedIn(email="ana@example.org"))
    assert server.signed_in_person() == "ana@example.org"
    assert server.session_owner() == server.session_owner() == "user:ana@example.org"


def test_without_sign_in_there_is_no_person():
    assert server.signed_in_person() is None


def test_outside_a_streamlit_runtime_a_session_never_ends():
    assert server.session_alive()() is True
