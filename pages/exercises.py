"""Predict, then measure: read the settings, enter a prediction, the lab runs it and explains the gap.

A flat page: the exercises, their scoring and explanations are in ``ckptlab.lab.exercises``; the
runs go through the device queue (``ckptlab.lab.learn``) and are shared with the other
Learn pages. The first answer to each exercise counts toward the session's score.

While the instructor's room has a round open (``ckptlab.lab.classroom``, led from
``pages/instructor.py``), the page shows that exercise on top, in a fragment that asks the room
every few seconds; the participant's first answer counts, and the room's answers appear once the
instructor closes the round.
"""

from __future__ import annotations

import streamlit as st

from ckptlab.lab import exercises, lesson_view
from ckptlab.lab.exercises import EXERCISES
from ckptlab.results import RunResult
from ckptlab.show.figures._style import PAGE_PX
from ckptlab.show.figures.prediction import guess_figure
from ckptlab.show.figures.run import runs_tradeoff_figure
from ckptlab.show.i18n import t
from ckptlab.spec import RunSpec
from pages._common import language, run_through_app
from pages._room import (
    IDS,
    NUMBER_BOXES,
    answer_refusal,
    exercise_label,
    follow_the_room,
    measured_runs,
    picked_id,
    prediction_box,
    provenance_caption,
    question,
)

run_through_app()

state = st.session_state
lang = language()


def go_next() -> None:
    state.exercise_pick = IDS[min(IDS.index(picked_id(state.exercise_pick)) + 1, len(IDS) - 1)]


def reset() -> None:
    state.exercise_answers = {}


state.setdefault("exercise_answers", {})  # exercise id -> the prediction locked in (its first answer)
state.setdefault("exercise_pick", IDS[0])
state.exercise_pick = picked_id(state.exercise_pick)  # an id, whatever label a browser sent back

st.title(t("exercises.page_title", lang), anchor=False)
st.markdown(t("exercises.intro", lang))
in_a_round = follow_the_room(lang)  # the instructor's round on top, while one is open

# The score is recomputed from the locked-in predictions and the measured runs, in the current language.
results_now: dict[RunSpec, RunResult] = state.setdefault("learn_results", {})
outcomes = lesson_view.outcomes(EXERCISES, state.exercise_answers, results_now, lang)
scored, possible = exercises.total_points(outcomes)
with st.sidebar:
    st.header(t("exercises.score_title", lang), anchor=False)
    st.metric(
        t("exercises.score", lang),
        f"{scored} / {possible}",
        help=t("exercises.score_help", lang, points=exercises.MAX_POINTS),
    )
    st.caption(t("exercises.answered", lang, done=len(outcomes), total=len(EXERCISES)))
    for answered in outcomes:  # here, not in the picker: a label that changes is sent back stale by the browser
        st.caption(t("exercises.answered_one", lang, exercise=exercise_label(answered, lang)))
    st.button(t("exercises.reset", lang), key="exercise_reset", on_click=reset, disabled=not state.exercise_answers)

if in_a_round:
    st.stop()  # the room's box is the only answer box: a second copy of the exercise here would not reach the room

pick, forward = st.columns([6, 1], vertical_alignment="bottom")
exercise_id = pick.selectbox(
    t("exercises.pick", lang),
    IDS,
    key="exercise_pick",
    format_func=lambda i: exercise_label(i, lang),  # stable: the ✓ of an answered exercise is in the sidebar
)
forward.button(
    t("exercises.next", lang), key="exercise_next", on_click=go_next, disabled=exercise_id == IDS[-1], width="stretch"
)
exercise = exercises.by_id(exercise_id)
question(exercise, lang, "exercise")

locked = exercise.id in state.exercise_answers
box = "pred" if exercise.kind in NUMBER_BOXES else "choice"  # the keys the page's boxes always had
guess = prediction_box(exercise, f"exercise_{box}_{exercise.id}", lang, disabled=locked)

if st.button(t("exercises.submit", lang), key="exercise_submit", type="primary", disabled=locked):
    if exercise.accepts(guess):  # the box has no bounds of its own (pages/_room.py): its range is checked here
        state.exercise_answers[exercise.id] = float(guess)
        locked = True
    else:
        st.warning(answer_refusal(exercise, guess, lang))

if locked:
    runs = measured_runs(exercise, lang)
    outcome = exercises.evaluate(exercise, state.exercise_answers[exercise.id], runs, lang)
    st.subheader(t("exercises.result_title", lang), anchor=False)
    if exercise.kind in ("percent", "kept"):
        unit = "%" if exercise.kind == "percent" else " KiB"
        left, right = st.columns([3, 2])
        left.plotly_chart(
            guess_figure(outcome.predicted, outcome.measured, lang=lang, unit=unit),
            key="exercise_result_chart",
            theme=None,
        )
    else:  # five settings in two panels take the page's width: in a 3/5 column "desligado" ran into "n=1"
        st.plotly_chart(
            runs_tradeoff_figure([runs[None], *(runs[n] for n in exercise.choices)], lang=lang, width=PAGE_PX),
            key="exercise_result_chart",
            theme=None,
        )
        right = st.container()
    with right:
        (st.success if outcome.points == exercises.MAX_POINTS else st.info if outcome.points else st.warning)(
            outcome.verdict
        )
        st.markdown(outcome.explanation)
        st.metric(t("exercises.points", lang), f"{outcome.points} / {outcome.possible}")
        provenance_caption(runs[None], lang)
    if exercise.id not in outcomes:
        st.rerun()  # the sidebar's score was drawn before this answer was measured
