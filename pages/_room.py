"""The instructor's room as both its pages draw it: an exercise's question, and a closed round's result. Not a page.

The instructor's page (``pages/instructor.py``) and every participant's Exercises page show the
same question and, once the round closes, the same result; the round itself is
``ckptlab.lab.classroom``'s.
"""

from __future__ import annotations

import streamlit as st

from ckptlab.lab.classroom import Round
from ckptlab.lab.exercises import Exercise, explain, time_judgement
from ckptlab.model.plan import planned_roles
from ckptlab.show.figures.diagram import roles_diagram_figure
from ckptlab.show.figures.room import room_figure
from ckptlab.show.i18n import Translator
from pages._common import preset_infos

ROOM_REFRESH_S = 3.0  # how often a page asks the room what changed: a few seconds, so measured runs are not disturbed


def question(exercise: Exercise, tr: Translator, lang: str, key: str) -> None:
    """The exercise's name, setting, plan (for a percent) and question, with its hint folded away."""
    st.subheader(tr(f"exercise.{exercise.id}.name"), anchor=False)
    st.markdown(tr("exercises.settings", model=exercise.spec.model, seq=exercise.spec.seq_len))
    if exercise.kind == "percent":
        st.plotly_chart(
            roles_diagram_figure(
                planned_roles(preset_infos()[exercise.spec.model].num_layers, exercise.spec.every_n_layers),
                lang=lang,
                height=220,
            ),
            key=f"{key}_plan",
            theme=None,
        )
    st.markdown(f"**{tr(f'exercise.{exercise.id}.question', **exercise.question_values())}**")
    with st.expander(tr("exercises.hint_title")):
        st.markdown(tr(f"exercise.{exercise.id}.hint"))


def measured_text(closed: Round, tr: Translator) -> str:
    """The measured answer as the room reads it: ``37%`` or ``every_n_layers=2`` (or that no choice fits)."""
    if closed.measured is None:
        return tr("classroom.none_fits")
    if closed.exercise.kind == "percent":
        return f"{closed.measured:,.0f}%"
    return f"every_n_layers={int(closed.measured)}"


def result(closed: Round, tr: Translator, lang: str, key: str) -> None:
    """A closed round: the room's predictions beside the measured answer, its one-line explanation and, for a timed
    exercise, the verdict on the noise; where the numbers were measured."""
    exercise = closed.exercise
    st.markdown(f"**{tr('classroom.result_title', number=closed.number)}**")
    left, right = st.columns([3, 2])
    left.plotly_chart(
        room_figure(exercise.kind, closed.answers, closed.measured, exercise.choices, lang=lang),
        key=f"{key}_chart",
        theme=None,
    )
    with right:
        st.metric(tr("classroom.measured"), measured_text(closed, tr))
        st.metric(tr("classroom.answers"), closed.count)
        st.markdown(explain(exercise, closed.runs, lang))
        judgement = time_judgement(exercise, closed.runs)
        if judgement is not None:
            st.caption(tr("classroom.noise", verdict=tr(f"noise.verdict_{judgement.value}")))
        off = closed.runs[None]
        st.caption(
            tr(
                "exercises.provenance",
                source=tr(f"provenance.{off.provenance.kind}", device=off.provenance.device_name),
            )
        )
