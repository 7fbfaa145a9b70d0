"""The instructor's policy and the participant's identity, as a page reads them. Not a page itself.

The policy (``ckptlab.lab.server``) comes from the environment and ``.streamlit/secrets.toml``
on every run of a page: cheap, and a changed setting needs no restart of the server.
"""

from __future__ import annotations

import uuid

import streamlit as st

import ckptlab
from ckptlab.lab.server import ServerPolicy, policy_from_environment
from ckptlab.show import i18n
from ckptlab.show.wording import app_message


def server_policy() -> tuple[ServerPolicy, ckptlab.CkptlabError | None]:
    """The policy, or the safe default (presets only, default limits) and why, when a setting is bad."""
    try:
        secrets = st.secrets.to_dict()
    except Exception:  # no secrets.toml at all: Streamlit raises rather than returning nothing
        secrets = {}
    try:
        return policy_from_environment(secrets), None
    except ckptlab.CkptlabError as error:
        return ServerPolicy(), error


def session_owner() -> str:
    """An id of this browser session, kept in its state: the device queue gives each one place at most.

    Not Streamlit's own session id: every AppTest shares one ("test session id"), so a test
    of several sessions would be one owner.
    """
    return st.session_state.setdefault("ckptlab_owner", uuid.uuid4().hex)


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
        return "", app_message(error, lang)
    offered = {policy.local_folder(name): name for name in policy.model_folders()}
    if absolute not in offered:
        return "", i18n.t("lab.folder_not_offered", lang, name=path)
    return offered[absolute], ""
