"""The room's predictions beside the measured answer: a histogram for a number, bars for a choice.

Every bar is a participant's prediction, in the guess colour; the measurement is a line (a
number) or the one bar drawn in the run's colour (a choice), named "measured" on the figure:
the room's predictions never pass for a measurement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go

from ..i18n import number, t
from ._style import GRID, GUESS_COLOR, OFF_COLOR, RUN_COLOR, on_white

# Plotly's toolbar (its modebar) sits over the top right of a figure, about 30 px tall: the labels over the plot sit
# under it, in rows of LABEL_ROW_PX, so "measured: 57%" near the right edge is never behind the buttons.
MODEBAR_PX = 34
LABEL_ROW_PX = 22
PERCENT_BIN = 10.0  # a histogram's bin, in percentage points: the width of the exercises' best band (within 10)


def room_figure(
    kind: str,
    answers: Sequence[float],
    measured: float | None,
    choices: Sequence[int] = (),
    *,
    lang: str = "en",
    height: int = 320,
) -> go.Figure:
    """How many participants predicted what, beside the measured answer.

    Args:
        kind: the exercise's kind: "percent" (a histogram of the answers, in bins of ``PERCENT_BIN``), "kept"
            (a histogram of KiB) or "choice" (one bar per choice).
        answers: the room's predictions, one per participant.
        measured: the measured answer (a percent of checkpointing off, or the every_n_layers that answers
            a choice); None when no choice fits.
        choices: the every_n_layers a choice offered.
        lang: the language of the labels.
    """
    figure = go.Figure()
    if kind in ("percent", "kept"):
        # A percent in bins of PERCENT_BIN points; KiB kept (the selective exercise) in bins of a tenth of the
        # measurement, its own score band.
        size = PERCENT_BIN if kind == "percent" else max((measured or 0) / 10, 1.0)
        figure.add_trace(
            go.Histogram(
                x=list(answers),
                xbins={"start": -size / 2, "size": size},  # bins centred on 0, size, 2 size, ...
                marker={"color": GUESS_COLOR, "line": {"color": "white", "width": 1}},
                name=t("classroom.fig_predictions", lang),
                hovertemplate="%{x}: %{y}<extra></extra>",
            )
        )
        value = (
            f"{number(measured or 0, ',.0f', lang)}%"
            if kind == "percent"
            else f"{number(measured or 0, ',.1f', lang)} KiB"
        )
        lines = [(measured, RUN_COLOR, t("classroom.fig_measured", lang, value=value), LABEL_ROW_PX)]
        if kind == "percent":  # checkpointing off is 100% of itself; KiB kept have no such line
            lines.insert(0, (100.0, OFF_COLOR, t("exercise.off_line", lang), 0))
        # The two labels on two heights: a measurement near 100% would otherwise write over the off line's.
        for x, color, text, shift in lines:
            if x is None:
                continue
            figure.add_vline(x=x, line={"color": color, "dash": "dash" if color == OFF_COLOR else "solid", "width": 3})
            figure.add_annotation(
                x=x,
                y=1.0,
                yref="paper",
                yanchor="bottom",
                yshift=shift,
                text=text,
                showarrow=False,
                font={"color": color},
            )
        axis = "classroom.fig_percent_axis" if kind == "percent" else "classroom.fig_kept_axis"
        figure.update_xaxes(title_text=t(axis, lang), gridcolor=GRID, rangemode="tozero")
    else:
        counts = Counter(int(answer) for answer in answers)
        right = None if measured is None else int(measured)
        labels = [f"every_n_layers={n}" for n in choices]
        figure.add_trace(
            go.Bar(
                x=labels,
                y=[counts.get(n, 0) for n in choices],
                marker={"color": [RUN_COLOR if n == right else GUESS_COLOR for n in choices]},
                text=[t("classroom.fig_measured_bar", lang) if n == right else "" for n in choices],
                textposition="outside",
                name=t("classroom.fig_predictions", lang),
                hovertemplate="%{x}: %{y}<extra></extra>",
            )
        )
        figure.update_xaxes(title_text=t("classroom.fig_choice_axis", lang))
    figure.update_layout(
        height=height,
        margin={"l": 50, "r": 20, "t": MODEBAR_PX + 2 * LABEL_ROW_PX + 6, "b": 50},
        **on_white(15, lang),
        showlegend=False,
        bargap=0.3 if kind == "choice" else 0.05,
    )
    figure.update_yaxes(title_text=t("classroom.fig_count_axis", lang), gridcolor=GRID, rangemode="tozero", dtick=1)
    return figure
