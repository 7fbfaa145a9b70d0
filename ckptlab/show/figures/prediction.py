"""A prediction beside the measurement: the formula's for each setting of a sweep, or a participant's guess.

The formula's bars are hatched and named "predicted (...)", the label on each its error; a
participant's guess is named "your prediction" in a colour of its own: a prediction never
passes for a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...explore.accuracy import PredictionCheck
from ...explore.sweep import SweepResult
from ...units import MIB
from ..i18n import number, t
from ._style import (
    CALIBRATED_COLOR,
    FORMULA_COLOR,
    GRID,
    GUESS_COLOR,
    MEASURED_COLOR,
    NOISE_GREY,
    OFF_COLOR,
    RUN_COLOR,
    on_white,
)
from .tradeoff import sweep_layout, sweep_provenance_label

_Values = Sequence[float | None]  # one per setting, None where there is none


def sweep_prediction_figure(
    result: SweepResult, checks: Sequence[PredictionCheck], seq_len: int, lang: str = "en"
) -> go.Figure:
    """Memory and time per setting: measured bars, the two predictions beside them with their error.

    Returns:
        Two panels: resident after the forward (MiB) and the step (ms); predicted bars are
        hatched and named "predicted (...)", their hover and label give the error.
    """
    rows = [check for check in checks if check.seq_len == seq_len]
    settings = [check.setting for check in rows]
    noisy = {row.setting for row in result.rows_at(seq_len) if row.time_is_noise}
    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(t("tradeoff_fig.resident_panel", lang), t("tradeoff_fig.step_panel", lang)),
        horizontal_spacing=0.1,
    )
    # (name, color, hatch, resident bytes, step seconds, their errors), one per source of numbers.
    series: list[tuple[str, str, str | None, _Values, _Values, _Values, _Values]] = [
        (
            t("tradeoff_fig.measured", lang),
            MEASURED_COLOR,
            None,
            [c.measured_after_forward_bytes for c in rows],
            [c.measured_step_s for c in rows],
            [None] * len(rows),
            [None] * len(rows),
        ),
        (
            t("tradeoff_fig.predicted_formula", lang),
            FORMULA_COLOR,
            "/",
            [c.formula_after_forward_bytes for c in rows],
            [c.formula_step_s for c in rows],
            [c.formula_error for c in rows],
            [c.formula_step_error for c in rows],
        ),
        (
            t("tradeoff_fig.predicted_calibrated", lang),
            CALIBRATED_COLOR,
            "\\",
            [c.calibrated_after_forward_bytes for c in rows],
            [c.calibrated_step_s for c in rows],
            [c.calibrated_error for c in rows],
            [c.calibrated_step_error for c in rows],
        ),
    ]
    for name, color, pattern, memory, time, memory_error, time_error in series:
        for col, values, errors, scale, unit in (
            (1, memory, memory_error, 1 / MIB, "MiB"),
            (2, time, time_error, 1000, "ms"),
        ):
            if all(value is None for value in values):
                continue
            figure.add_trace(
                go.Bar(
                    x=settings,
                    y=[None if v is None else v * scale for v in values],
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    marker={
                        # A measured step time within the noise of off's is grey, as on the trade-off figure.
                        "color": [NOISE_GREY if setting in noisy else color for setting in settings]
                        if col == 2 and pattern is None
                        else color,
                        "pattern": {"shape": pattern} if pattern else None,
                    },
                    text=[_error_text(e, lang) for e in errors],
                    textposition="outside",
                    # Upright along the bar, at its size: a bar of a group is narrower than "+22.0%" lying down, and
                    # plotly shrank the words to fit it (about 5 px tall at 1280x720, issue 43).
                    textangle=-90,
                    constraintext="none",
                    textfont={"size": 11},
                    cliponaxis=False,
                    hovertemplate="%{x}: %{y:,.1f} "
                    + unit
                    + (" (error %{text})" if pattern else "")
                    + f"<extra>{name}</extra>",
                ),
                row=1,
                col=col,
            )
    subtitle = t("tradeoff_fig.prediction_subtitle", lang, provenance=sweep_provenance_label(result, lang))
    experts = {check.formula_experts_counted for check in rows} - {None}
    if experts:  # MoE: whether the formula counted the experts' activations, said where the prediction is shown
        subtitle += " · " + t(
            "tradeoff_fig.experts_counted" if experts == {True} else "tradeoff_fig.experts_left_out", lang
        )
    sweep_layout(figure, lang, t("tradeoff_fig.prediction_title", lang, model=result.model, seq=seq_len), subtitle)
    figure.update_layout(barmode="group")
    return figure


def _error_text(error: float | None, lang: str) -> str:
    return "" if error is None else f"{number(error * 100, '+.1f', lang)}%"


def guess_figure(
    predicted: float, measured: float, *, lang: str = "en", unit: str = "%", height: int = 260
) -> go.Figure:
    """A participant's prediction beside the measurement (an exercise's answer), 100 marking checkpointing off."""
    labels = [t("exercise.your_prediction", lang), t("exercise.measured", lang)]
    # Explicit room for the labels: Streamlit's plotly.js cuts them off with automargin alone (see diagram.py).
    label_px = 20 + 9 * max(len(label) for label in labels) * (2 if lang == "ja" else 1)
    figure = go.Figure(
        go.Bar(
            y=labels,
            x=[predicted, measured],
            orientation="h",
            marker={"color": [GUESS_COLOR, RUN_COLOR]},
            text=[f"{number(predicted, ',.0f', lang)}{unit}", f"{number(measured, ',.0f', lang)}{unit}"],
            textposition="outside",
            hoverinfo="skip",
        )
    )
    if unit == "%":
        figure.add_vline(x=100, line={"color": OFF_COLOR, "dash": "dash", "width": 2})
        figure.add_annotation(
            x=100,
            y=1.0,
            yref="paper",
            yanchor="bottom",
            xanchor="right",
            text=t("exercise.off_line", lang),
            showarrow=False,
            font={"color": OFF_COLOR},
        )
    top = max(predicted, measured, 100 if unit == "%" else 0)
    figure.update_layout(
        height=height,
        margin={"l": label_px, "r": 30, "t": 30, "b": 30},
        **on_white(15, lang),
        showlegend=False,
    )
    figure.update_xaxes(range=[0, top * 1.2 or 1], gridcolor=GRID, fixedrange=True)
    figure.update_yaxes(autorange="reversed", fixedrange=True)
    return figure
