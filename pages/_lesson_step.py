"""The lesson's last part: one training step event by event, with a slider and a Play button. Not a page.

Its state: ``lesson_step_setting`` (the setting shown), ``lesson_step`` (the event), ``lesson_playing``
and ``lesson_last`` (the last event's index, for Play at the end to start over).
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from ckptlab.lab import learnpage
from ckptlab.results import RunResult
from ckptlab.show.figures.diagram import focus_of
from ckptlab.show.figures.timeline import step_figure, timeline_figure
from ckptlab.show.i18n import t

STEP_SETTINGS = (None, 1, 2, 3)
PLAY_SECONDS = 0.8  # between two events while playing: slow enough to read on a projector


def toggle_play() -> None:
    state = st.session_state
    playing = not state.get("lesson_playing", False)
    if playing and state.get("lesson_step", 0) >= state.get("lesson_last", 0):
        state.lesson_step = 0  # Play at the end starts over
    state.lesson_playing = playing


def draw_step_through(run_at: Callable[[int | None], RunResult], lang: str) -> None:
    """The setting's picker, Play, then the slider and figures of the run ``run_at(every_n_layers)`` measures."""
    state = st.session_state
    st.markdown(t("lesson.step.body", lang))
    state.setdefault("lesson_step_setting", 2)
    setting = st.segmented_control(
        t("lesson.step.setting", lang),
        STEP_SETTINGS,
        key="lesson_step_setting",
        required=True,
        format_func=lambda n: t("setting.off", lang) if n is None else t("setting.on", lang, n=n),
    )
    run = run_at(setting)
    points = run.memory.timeline
    state.lesson_last = len(points) - 1
    state.setdefault("lesson_step", 0)
    state.lesson_step = min(state.lesson_step, len(points) - 1)
    playing = state.get("lesson_playing", False)
    st.button(
        t("lesson.step.pause", lang) if playing else t("lesson.step.play", lang),
        key="lesson_play",
        on_click=toggle_play,
        type="primary",
        icon=":material/pause:" if playing else ":material/play_arrow:",
    )

    @st.fragment(run_every=PLAY_SECONDS if playing else None)
    def stepper() -> None:
        """The slider and the figures; while playing, each timer tick moves one event on."""
        if state.get("lesson_playing", False):
            if state.lesson_step < len(points) - 1:
                state.lesson_step += 1
            else:
                state.lesson_playing = False
                st.rerun()  # a full run, so the fragment's timer stops and the button says Play again
        index = st.select_slider(
            t("lesson.step.slider", lang),
            options=list(range(len(points))),
            key="lesson_step",
            format_func=lambda i: learnpage.event_option(points, i, lang),
        )
        left, right = st.columns(2)
        left.plotly_chart(step_figure(run, index, lang=lang, height=420), key="lesson_step_chart", theme=None)
        right.plotly_chart(
            timeline_figure(run, lang=lang, cursor=index, height=420), key="lesson_step_timeline", theme=None
        )
        diagram = learnpage.run_diagram(run, lang, focus=focus_of(points[index]), height=230)
        st.plotly_chart(diagram, key="lesson_step_diagram", theme=None)
        st.caption(t("lesson.step.legend", lang))

    stepper()
