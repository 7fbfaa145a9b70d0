"""The instructor's room as both its pages draw it: an exercise's question, and a closed round's result. Not a page.

The instructor's page (``pages/instructor.py``) and every participant's Exercises page show the
same question and, once the round closes, the same result; the round itself is
``ckptlab.lab.classroom``'s.
"""

from __future__ import annotations

import streamlit as st

from ckptlab.lab import classroom, exercises, forged, lesson_view
from ckptlab.lab.classroom import Round
from ckptlab.lab.exercises import EXERCISES, Exercise, explain, time_judgement
from ckptlab.model.plan import planned_roles
from ckptlab.results import RunResult
from ckptlab.show.figures.diagram import roles_diagram_figure
from ckptlab.show.figures.room import room_figure
from ckptlab.show.i18n import Literal, number, t
from ckptlab.show.wording import run_message
from pages._common import preset_infos, refuse_forged
from pages._learn_runs import measured
from pages._server import keep_participant_key, server_policy, session_owner

ROOM_REFRESH_S = 3.0  # how often a page asks the room what changed: a few seconds, so measured runs are not disturbed
IDS = [exercise.id for exercise in EXERCISES]
# A number to predict: its label, first value and step, by the exercise's kind (its range: exercises.ANSWER_RANGES).
NUMBER_BOXES = {
    "percent": ("exercises.prediction_percent", 100.0, 5.0),
    "kept": ("selective.prediction_kib", 0.0, 16.0),
}


def exercise_label(exercise_id: str, lang: str) -> str:
    """An exercise in a picker: its number, its level in stars and its name."""
    level = exercises.by_id(exercise_id).level
    return f"{IDS.index(exercise_id) + 1}. {'★' * level} {t('exercise.' + exercise_id + '.name', lang)}"


def picked_id(value: object) -> str:
    """The exercise a picker's value names: its id, or a label (``"3. ★★ …"``) a browser sent back for it.

    A browser keeps the label it drew and sends that back; when the label is no longer among the options,
    Streamlit hands the page the string (DESIGN.md's pitfalls). Labels start with the exercise's number, in
    every language and whatever follows it, so the number finds the id; anything else is the first exercise.
    """
    if value in IDS:
        return str(value)
    number = str(value).split(".", 1)[0].strip()
    return IDS[int(number) - 1] if number.isdigit() and 1 <= int(number) <= len(IDS) else IDS[0]


def measured_runs(exercise: Exercise, lang: str, wait: bool = False) -> dict[int | None, RunResult]:
    """The exercise's runs, measured through the Learn pages' shared runs (``wait``: with progress, until they are);
    the page stops while they are not there or when one failed, its message shown."""
    results = measured(exercise.specs(), lang, wait=wait)
    if results is None:
        st.stop()  # the progress or the message is shown
    runs = lesson_view.exercise_runs(exercise, results)
    failed = [run for run in runs.values() if run.status != "ok"]
    if failed:
        st.error(run_message(failed[0], lang))
        st.stop()
    return runs


def prediction_box(exercise: Exercise, key: str, lang: str, disabled: bool) -> float:
    """The box a prediction goes in, kept in ``key``: a number (a percent, the KiB kept) or one of the exercise's
    every_n_layers."""
    if exercise.kind in NUMBER_BOXES:
        label, first, step = NUMBER_BOXES[exercise.kind]
        st.session_state.setdefault(key, first)
        # No min or max: Streamlit puts a number outside a box's bounds back to its default before the page sees it
        # (401 sent over the websocket arrived as 0, and counted). The page checks the value as sent
        # (Exercise.accepts, the one range) and refuses it by name (answer_refusal); a NaN arrives as None, refused.
        return st.number_input(t(label, lang), value=None, step=step, format="%g", key=key, disabled=disabled)
    return st.radio(
        t("exercises.prediction_choice", lang),
        exercise.choices,
        key=key,
        horizontal=True,
        format_func=lambda n: f"every_n_layers={n}",
        disabled=disabled,
    )


def answer_refusal(exercise: Exercise, value: object, lang: str) -> str:
    """Why ``value`` is no answer to ``exercise`` (:meth:`Exercise.accepts` said so): its range, or its choices."""
    shown = Literal(forged.shown_value(value))  # sent by a participant: shown as text
    if exercise.kind == "choice":
        choices = ", ".join(str(n) for n in exercise.choices)
        return t("classroom.answer_not_a_choice", lang, value=shown, choices=choices)
    low, high = exercises.ANSWER_RANGES[exercise.kind]
    return t("classroom.answer_out_of_range", lang, value=shown, low=low, high=high)


def provenance_caption(off: RunResult, lang: str) -> None:
    """Where the exercise's numbers were measured (its checkpointing-off run's device)."""
    source = t(f"provenance.{off.provenance.kind}", lang, device=off.provenance.device_name)
    st.caption(t("exercises.provenance", lang, source=source))


def question(exercise: Exercise, lang: str, key: str) -> None:
    """The exercise's name, setting, plan (for a percent) and question, with its hint folded away."""
    st.subheader(t(f"exercise.{exercise.id}.name", lang), anchor=False)
    st.markdown(t("exercises.settings", lang, model=exercise.spec.model, seq=exercise.spec.seq_len))
    if exercise.kind in ("percent", "kept"):
        st.plotly_chart(
            roles_diagram_figure(
                planned_roles(preset_infos()[exercise.spec.model].num_layers, exercise.spec.every_n_layers),
                lang=lang,
                height=220,
            ),
            key=f"{key}_plan",
            theme=None,
        )
    st.markdown(f"**{t(f'exercise.{exercise.id}.question', lang, **exercise.question_values())}**")
    with st.expander(t("exercises.hint_title", lang)):
        st.markdown(t(f"exercise.{exercise.id}.hint", lang))


def measured_text(closed: Round, lang: str) -> str:
    """The measured answer as the room reads it: ``37%`` or ``every_n_layers=2`` (or that no choice fits)."""
    if closed.measured is None:
        return t("classroom.none_fits", lang)
    if closed.exercise.kind == "percent":
        return f"{number(closed.measured, ',.0f', lang)}%"
    if closed.exercise.kind == "kept":
        return f"{number(closed.measured, ',.1f', lang)} KiB"
    return f"every_n_layers={int(closed.measured)}"


def result(closed: Round, lang: str, key: str) -> None:
    """A closed round: the room's predictions beside the measured answer, its one-line explanation and, for a timed
    exercise, the verdict on the noise; where the numbers were measured."""
    exercise = closed.exercise
    st.markdown(f"**{t('classroom.result_title', lang, number=closed.number)}**")
    left, right = st.columns([3, 2])
    left.plotly_chart(
        room_figure(exercise.kind, closed.answers, closed.measured, exercise.choices, lang=lang),
        key=f"{key}_chart",
        theme=None,
    )
    with right:
        st.metric(t("classroom.measured", lang), measured_text(closed, lang))
        st.metric(t("classroom.answers", lang), closed.count)
        st.markdown(explain(exercise, closed.runs, lang))
        judgement = time_judgement(exercise, closed.runs)
        if judgement is not None:
            st.caption(t("classroom.noise", lang, verdict=t(f"noise.verdict_{judgement.value}", lang)))
        provenance_caption(closed.runs[None], lang)


def follow_the_room(lang: str) -> bool:
    """A participant's side of the room, on the Exercises page: the open round's exercise and the answer box, then the
    room's result once the instructor closes it (for the rounds this session saw open), refreshed by a fragment.

    Returns whether a round is open: then the room's box is the only answer box, and the page leaves its own copy of
    the exercises out. The fragment reruns the whole page when a round opens or closes, so the page follows.
    """
    state = st.session_state
    if server_policy()[0].has_instructor:
        keep_participant_key()  # one answer per browser, its tabs included
    now = classroom.ROOM.current()
    state.classroom_open_drawn = now is not None and now.is_open  # what the whole page was drawn for
    state.setdefault("classroom_mine", {})  # round number -> this participant's answer the room counted
    state.setdefault("classroom_rounds", set())  # the rounds this session saw open: their results follow it

    def answer(number: int, pred_key: str) -> None:
        value = state.get(pred_key)
        asked = classroom.ROOM.current()
        if asked is not None and asked.number == number and not asked.exercise.accepts(value):  # type: ignore[arg-type]
            state.classroom_bad_answer, state.classroom_refused = (number, value), None  # said by name, not counted
            return
        state.classroom_bad_answer = None
        if not isinstance(value, (int, float)):
            return  # the round moved on meanwhile: nothing to count
        value = float(value)
        counted = classroom.ROOM.answer(number, session_owner(), value)  # a participant's first answer only
        if counted:
            state.classroom_mine[number] = value
        state.classroom_refused = None if counted else number  # said on the page: a second answer, or a closed round

    def hide(number: int) -> None:
        state.classroom_rounds.discard(number)  # the next round shows again

    # Without an instructor's phrase set no round can open, so the page does not ask the room at all.
    @st.fragment(run_every=ROOM_REFRESH_S if server_policy()[0].has_instructor else None)
    def room() -> None:
        now = classroom.ROOM.current()
        if (now is not None and now.is_open) != state.classroom_open_drawn:
            st.rerun(scope="app")  # a round opened or closed: the page's own exercises hide or come back
        if now is None or (not now.is_open and now.number not in state.classroom_rounds):
            return
        state.classroom_rounds.add(now.number)
        with st.container(border=True):
            st.header(t("classroom.room_title", lang, number=now.number), anchor=False)
            question(now.exercise, lang, "classroom")
            mine = state.classroom_mine.get(now.number)
            if now.is_open:
                pred_key = f"classroom_pred_{now.number}"
                prediction_box(now.exercise, pred_key, lang, disabled=mine is not None)
                # Once the room has this participant's answer the button says so and is off: a live "Send" after
                # sending read as if the answer had not gone (a second tab's answer still gets classroom.not_counted).
                st.button(
                    t("classroom.submit" if mine is None else "classroom.sent", lang),
                    key="classroom_submit",
                    type="primary",
                    on_click=answer,
                    args=(now.number, pred_key),
                    disabled=mine is not None,
                )
            if state.get("classroom_refused") == now.number:
                st.warning(t("classroom.not_counted", lang))
            bad = state.get("classroom_bad_answer")
            if bad is not None and bad[0] == now.number:
                st.warning(answer_refusal(now.exercise, bad[1], lang))
            if mine is not None:
                st.caption(t("classroom.your_answer", lang, value=f"{mine:g}"))
            if now.is_open:
                st.info(t("classroom.waiting", lang, count=now.count))
            else:
                result(now, lang, "classroom")
                st.button(t("classroom.hide", lang), key="classroom_hide", on_click=hide, args=(now.number,))

    for refused in refuse_forged({}, lang):  # a room answer Streamlit could not read back (a string for a number)
        st.warning(refused)
    room()
    return bool(state.classroom_open_drawn)
