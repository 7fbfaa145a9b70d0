"""The instructor's policy and the participant's identity, as a page reads them. Not a page itself.

The policy (``ckptlab.lab.server``) comes from the environment and ``.streamlit/secrets.toml``
on every run of a page: cheap, and a changed setting needs no restart of the server.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

import ckptlab
from ckptlab.lab.server import ServerPolicy, policy_from_environment
from ckptlab.lab.workers import WorkerPool, device_workers, simulation_workers, sweep_workers
from ckptlab.model import folder_files, hub
from ckptlab.show import i18n
from ckptlab.show.wording import app_message


def server_policy() -> tuple[ServerPolicy, ckptlab.CkptlabError | None]:
    """The policy, or the safe default (presets only, default limits) and why, when a setting is bad."""
    try:
        secrets = st.secrets.to_dict()
    except Exception:  # no secrets.toml at all: Streamlit raises rather than returning nothing
        secrets = {}
    try:
        policy, problem = policy_from_environment(secrets), None
    except ckptlab.CkptlabError as error:
        policy, problem = ServerPolicy(), error
    folder_files.confine(policy.models_root)  # every file a model folder leads to stays inside it (and in workers)
    hub.configure(
        policy.hub_access()
    )  # Hub names off unless CKPTLAB_HUB=1; the server's cache and token (and in workers)
    return policy, problem


def session_owner() -> str:
    """Who asks: the device queue gives each one place at most.

    The signed-in person (``st.user``) where the server has sign-in configured, so three tabs of
    one person hold one place; else an id of this browser session, kept in its state. Never the
    IP address, which a classroom behind one router shares. Not Streamlit's own session id:
    every AppTest shares one ("test session id"), so a test of several sessions would be one owner.
    """
    person = signed_in_person()
    if person is not None:
        return f"user:{person}"
    owner = st.session_state.get("ckptlab_owner")
    if owner is None:
        # A new tab of a browser that already has a key (keep_participant_key) is the same participant.
        kept = str(st.context.cookies.get(PARTICIPANT_COOKIE) or "")
        owner = kept if _PARTICIPANT_KEY.fullmatch(kept) else uuid.uuid4().hex
        st.session_state["ckptlab_owner"] = owner
    return owner


PARTICIPANT_COOKIE = "ckptlab_participant"  # this browser's participant key, for a year, on this server only
_PARTICIPANT_KEY = re.compile(r"[0-9a-f]{32}")  # what session_owner writes: anything else is ignored


def keep_participant_key() -> None:
    """Keep this session's participant key in a cookie of this browser, so a new tab counts as the same participant.

    Streamlit cannot set a cookie from the server (``st.context.cookies`` is read-only), so a small script in the
    page sets it; the next session's ``st.context.cookies`` brings it back. The key is the session's own hex id (no
    quote nor markup can reach the script). A browser with scripts off, a private window or a scripted client is
    a new participant each time: only sign-in closes that (docs/security.md).

    The script is in every run of the page until a session opens with the key in its cookie, not in the first run
    only: the browser loads the code of an HTML element lazily, and a run that follows at once (a click) removed an
    element drawn once before its script ever ran (a participant with no cookie after three answers, CI of
    2026-12-04). Drawn in the same place each run, the element stays and its script runs once."""
    if signed_in_person() is not None:
        return
    owner = session_owner()
    if st.context.cookies.get(PARTICIPANT_COOKIE) != owner:
        st.html(
            f"<script>document.cookie = '{PARTICIPANT_COOKIE}={owner}; path=/; max-age=31536000; SameSite=Strict';"
            "</script>",
            unsafe_allow_javascript=True,
        )


def signed_in_person() -> str | None:
    """The signed-in person's e-mail (or subject id), or None without sign-in."""
    try:
        if not st.user.is_logged_in:
            return None
        person = st.user.get("email") or st.user.get("sub")
    except Exception:  # no sign-in configured on this server (secrets without [auth])
        return None
    return str(person) if person else None


def session_alive() -> Callable[[], bool]:
    """A check a job asks from its own thread: False once this browser session is gone (its tab closed).

    Streamlit's runtime knows its sessions; a job whose session is gone ends, so a closed tab's sweep
    does not keep taking device turns. A session whose websocket dropped (a loaded server, a classroom's
    wifi) is inactive until the tab reconnects, and Streamlit keeps it ``server.disconnectedSessionTTL``
    seconds for that: only a session inactive for longer is gone, so a reconnecting tab keeps its job.
    Without a runtime (AppTest, a script) the session
    never ends.
    """
    context = get_script_run_ctx()
    if context is None or not Runtime.exists():
        return lambda: True
    runtime, session_id = Runtime.instance(), context.session_id
    grace_s = float(st.get_option("server.disconnectedSessionTTL"))
    inactive_since: list[float] = []  # when the session was first seen inactive, while it is

    def alive() -> bool:
        if runtime.is_active_session(session_id):
            inactive_since.clear()
            return True
        if not inactive_since:
            inactive_since.append(time.monotonic())
        return time.monotonic() - inactive_since[0] <= grace_s

    return alive


POOLS = {"device": device_workers, "sweep": sweep_workers, "simulation": simulation_workers}


def job_workers(policy: ServerPolicy, kind: str) -> WorkerPool | None:
    """The server's worker pool for ``kind`` of job ("device": measured runs, "sweep", "simulation"), started on
    first use; None when the policy runs jobs in the server's threads (CKPTLAB_WORKERS=thread)."""
    return POOLS[kind]() if policy.workers else None


def offered_folder(policy: ServerPolicy, path: str, lang: str) -> tuple[str, str]:
    """A link's model folder as one the policy offers (its name under the root), or ("", why not).

    Args:
        policy: the server's policy.
        path: the folder as the link gives it (absolute, or relative to the root).
        lang: the page's language, for the reason.
    """
    try:
        absolute = policy.local_folder(path)
    except ckptlab.CkptlabError as error:
        return "", i18n.markdown_literal(app_message(error, lang))  # it names the link's path: shown as text
    offered = {policy.local_folder(name): name for name in policy.model_folders()}
    if absolute not in offered:
        return "", i18n.t("lab.folder_not_offered", lang, name=i18n.Literal(path))
    return offered[absolute], ""
