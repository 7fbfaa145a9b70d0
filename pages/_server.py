"""The instructor's policy and the participant's identity, as a page reads them. Not a page itself.

The policy (``ckptlab.lab.server``) comes from the environment and ``.streamlit/secrets.toml``
on every run of a page: cheap, and a changed setting needs no restart of the server.
"""

from __future__ import annotations

import uuid

import streamlit as st

import ckptlab
from ckptlab.lab.server import ServerPolicy, policy_from_environment


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
