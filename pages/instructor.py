"""The instructor's room: open a round on one exercise, watch the answers arrive, close it, show the spread.

Reached by typing the phrase the server sets (``CKPTLAB_INSTRUCTOR_SECRET`` in the environment
or ``.streamlit/secrets.toml``) into a password field: never in the URL, which the projector
shows. Without the phrase set, the page offers nothing but how to set it. The round lives in
``ckptlab.lab.classroom`` (this server's memory only); its runs are measured once, before it
opens, through the Learn pages' shared runs (``pages/_learn_runs.py``).
"""

from __future__ import annotations

import math
import time

import streamlit as st

import ckptlab
from ckptlab.lab import exercises, forged
from ckptlab.lab.classroom import ROOM, round_csv
from ckptlab.lab.server import PhraseDelay
from ckptlab.show.i18n import t
from ckptlab.show.wording import app_message
from pages._common import download_buttons, language, refuse_forged, run_through_app
from pages._room import IDS, ROOM_REFRESH_S, exercise_label, measured_runs, question, result
from pages._server import server_policy

run_through_app()

state = st.session_state
lang = language()

st.title(t("classroom.page_title", lang), anchor=False)
policy, problem = server_policy()
if problem is not None:
    st.error(app_message(problem, lang))
if not policy.has_instructor:
    st.info(t("classroom.no_secret", lang))
    st.stop()
st.markdown(t("classroom.intro", lang))
for refused in refuse_forged({"classroom_secret": forged.text}, lang):  # a phrase box holds text, nothing else
    st.error(refused)
typed = st.text_input(t("classroom.secret", lang), type="password", key="classroom_secret")
if not typed:
    st.info(t("classroom.enter_secret", lang))
    st.stop()
# Each wrong phrase from this session makes it wait longer before the next is checked (ckptlab.lab.server.PhraseDelay).
delay = state.setdefault("classroom_phrase_delay", PhraseDelay())
wait_s = delay.wait_s(time.monotonic())
if wait_s > 0:
    st.error(t("classroom.phrase_wait", lang, seconds=math.ceil(wait_s)))
    st.stop()
if not policy.is_instructor(typed):
    delay.failed(time.monotonic())
    st.error(t("classroom.wrong_secret", lang))
    st.stop()
delay.passed()

# -- the instructor's controls: only past the phrase, checked again on every run -------------


def open_round(exercise_id: str) -> None:
    """Measure the exercise's runs (one device turn for the room, or none when they are shared already), then open."""
    exercise = exercises.by_id(exercise_id)
    runs = measured_runs(exercise, lang, wait=True)
    try:
        ROOM.open(exercise, runs)
    except ckptlab.CkptlabError as error:  # another instructor's tab opened one meanwhile
        st.error(app_message(error, lang))
        st.stop()


problem_now = state.pop("classroom_problem", None)
if problem_now:
    st.error(problem_now)
now = ROOM.current()
if now is None or not now.is_open:
    pick = st.selectbox(
        t("classroom.pick", lang),
        IDS,
        key="classroom_exercise",
        format_func=lambda i: exercise_label(i, lang),
    )
    if st.button(t("classroom.open", lang), key="classroom_open", type="primary"):
        open_round(pick)
        st.rerun()
    if now is not None:  # the last round, closed: its result stays until the next opens
        st.divider()
        question(now.exercise, lang, "instructor")
        result(now, lang, "instructor")
        download_buttons(
            f"ckptlab-round-{now.number}-{now.exercise_id}",
            [(t("classroom.download", lang), round_csv(now), "csv", "classroom_download")],
        )
    st.stop()

st.header(t("classroom.room_title", lang, number=now.number), anchor=False)
question(now.exercise, lang, "instructor")


def close_round(number: int) -> None:
    """Close the round this page showed (its number fixed when drawn, so a round opened since in another tab of the
    instructor's stays open)."""
    typed = state.get("classroom_secret")
    if not isinstance(typed, str) or not server_policy()[0].is_instructor(typed):
        return  # a press reaches its callback before the page checks the phrase: check it here too
    try:
        ROOM.close(number)
    except ckptlab.CkptlabError as error:
        state.classroom_problem = app_message(error, lang)


st.button(t("classroom.close", lang), key="classroom_close", type="primary", on_click=close_round, args=(now.number,))


@st.fragment(run_every=ROOM_REFRESH_S)
def answered() -> None:
    """How many participants answered so far, asked of the room every few seconds (the answers stay hidden)."""
    current = ROOM.current()
    if current is None or current.number != now.number or not current.is_open:
        st.rerun(scope="app")  # closed, or another opened, from another tab of the instructor's: draw it anew
    st.metric(t("classroom.answers", lang), current.count)


answered()
