"""Who a participant is to the device queue: the signed-in person where sign-in is on, else the browser session."""

from __future__ import annotations

from types import SimpleNamespace

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


class _Runtime:
    """Streamlit's runtime as session_alive sees it: whether the one session is connected now."""

    connected = True

    @classmethod
    def exists(cls) -> bool:
        return True

    @classmethod
    def instance(cls) -> _Runtime:
        return cls()

    def is_active_session(self, session_id: str) -> bool:
        assert session_id == "tab"
        return _Runtime.connected


class _Clock:
    now = 0.0

    @classmethod
    def monotonic(cls) -> float:
        return cls.now


def test_a_tab_that_reconnects_within_the_session_ttl_keeps_its_job_and_a_closed_one_ends_it(monkeypatch):
    """A dropped websocket makes the session inactive until the tab reconnects; only past Streamlit's TTL is it gone."""
    monkeypatch.setattr(server, "get_script_run_ctx", lambda: type("Context", (), {"session_id": "tab"})())
    monkeypatch.setattr(server, "Runtime", _Runtime)
    monkeypatch.setattr(server, "time", _Clock)
    monkeypatch.setattr(server.st, "get_option", {"server.disconnectedSessionTTL": 120}.__getitem__)
    alive = server.session_alive()
    assert alive()
    _Runtime.connected = False  # the websocket dropped
    assert alive()
    _Clock.now = 119.0
    assert alive()
    _Runtime.connected = True  # the tab reconnected: the grace starts over at the next drop
    assert alive()
    _Runtime.connected, _Clock.now = False, 200.0
    assert alive()
    _Clock.now = 320.5  # inactive past the TTL: Streamlit has dropped the session
    assert not alive()
    _Runtime.connected = True  # (class state, for the next test)


def test_the_key_writer_is_in_every_run_until_a_session_opens_with_the_key(monkeypatch):
    """Drawn in one run only, the script's element went with the next run before the browser ran it (the participant's
    journey, CI of 2026-12-04): it is in each run, at one place, until the browser's cookie brings the key back."""
    written: list[str] = []
    monkeypatch.setattr(server.st, "html", lambda body, **_: written.append(body))
    server.keep_participant_key()
    server.keep_participant_key()  # the page's next run, in the same session
    owner = server.session_owner()
    assert len(written) == 2 and written[0] == written[1] and f"{server.PARTICIPANT_COOKIE}={owner};" in written[0]
    monkeypatch.setattr(server.st, "context", SimpleNamespace(cookies={server.PARTICIPANT_COOKIE: owner}))
    server.keep_participant_key()  # a session whose browser sent the key: nothing to write
    assert len(written) == 2
