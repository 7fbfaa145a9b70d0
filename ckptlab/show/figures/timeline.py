"""Memory through one training step, and one moment of it: what each layer holds there.

Drawn from measured (or simulated) :class:`~ckptlab.RunResult` objects, their recorded
timeline and layer rows; every word comes from the locale files through
:func:`ckptlab.show.i18n.t`, in the language passed in. Also here: the sentence that says
why the peak is where it is on the timeline.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from ...errors import SpecError
from ...results import RunResult, memory_of
from ...step import timeline as tl
from ...units import MIB
from ..i18n import number, t
from ..labels import event_label, provenance_label, run_label
from ._style import (
    BAND_COLORS,
    CURSOR_COLOR,
    EXTRA_COLORS,
    GRID,
    LEGEND_BACKGROUND,
    OFF_COLOR,
    OUTLINE_GREY,
    PHASE_LABEL_COLOR,
    RUN_COLOR,
    STATE_COLORS,
    WASH_GRID,
    heading,
    legend,
    on_white,
)


def peak_cause(run: RunResult, lang: str) -> str:
    """Why the peak is where it is: the stretch, and the largest categories held there (where the meter tells)."""
    timeline = memory_of(run).timeline
    point = timeline[tl.peak_index(timeline)]
    where = event_label(point, lang)
    parts = sorted(
        ((value, key) for key, value in point.region_peak_breakdown.items() if key not in ("parameter", "buffer")),
        reverse=True,
    )[:2]
    if not parts:
        return where
    held = ", ".join(f"{t('category.' + key, lang)} {number(value / MIB, ',.1f', lang)} MiB" for value, key in parts)
    return t("timeline.peak_cause", lang, where=where, held=held)


def _above(run: RunResult, value: int) -> float:
    return (value - memory_of(run).baseline_bytes) / MIB


def timeline_figure(
    run: RunResult,
    others: Sequence[RunResult] = (),
    *,
    lang: str = "en",
    cursor: int | None = None,
    height: int = 470,
) -> go.Figure:
    """Memory above the baseline through one training step, phases shaded, layers marked, peaks annotated.

    The solid line is the memory in use at each event; the dotted steps are the highest
    memory between an event and the next (where a rerun's bump shows). ``others`` (for
    example checkpointing off) are overlaid on the same axis: layer by layer at the same place.

    Args:
        run: the setting shaded and annotated.
        others: further runs of the same model and shape to overlay.
        lang: language of every word on the figure.
        cursor: an event index of ``run`` to mark with a vertical line (the slider's position).
        height: pixels.

    Raises:
        ValueError: a run has no memory timeline (it did not fit, or predates timelines).
    """
    for each in (run, *others):
        if each.memory is None or not memory_of(each).timeline:
            raise SpecError(key="api.no_timeline", spec=each.spec)
    layers = run.model.num_layers
    figure = go.Figure()
    spans = tl.phase_spans(memory_of(run).timeline, layers)
    for span in spans:
        # A rerun's role colour, lightened; a phase's wash is pale already.
        opacity = 0.28 if span.band == "rerun" else 1.0
        figure.add_vrect(
            x0=span.start, x1=span.end, fillcolor=BAND_COLORS[span.band], opacity=opacity, line_width=0, layer="below"
        )
    for band, (start, end) in _band_extents(spans).items():
        if band == "rerun":
            continue
        figure.add_annotation(  # a row of its own between the subtitle and the plot: peak labels sit inside
            x=(start + end) / 2,
            y=1.0,
            yref="paper",
            yanchor="bottom",
            showarrow=False,
            text=f"<b>{t('band.' + band, lang)}</b>",
            font={"size": 15, "color": PHASE_LABEL_COLOR},
        )
    if any(span.band == "rerun" for span in spans):
        figure.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=t("timeline.legend_rerun", lang),
                marker={"symbol": "square", "size": 14, "color": BAND_COLORS["rerun"], "opacity": 0.5},
            )
        )

    series = [(run, RUN_COLOR if run.spec.checkpointing else OFF_COLOR)] + [
        (other, EXTRA_COLORS[index % len(EXTRA_COLORS)] if other.spec.checkpointing else OFF_COLOR)
        for index, other in enumerate(others)
    ]
    top = 0.0
    for position_in_list, (each, color) in enumerate(series):
        first = position_in_list == 0
        points = memory_of(each).timeline
        xs = tl.positions(points, layers)
        ends = tl.stretch_ends(points, layers)
        name = run_label(each, lang)
        now = [_above(each, point.current_bytes) for point in points]
        high = [_above(each, point.region_peak_bytes) for point in points]
        top = max(top, *high)
        hover = [
            f"<b>{event_label(point, lang)}</b><br>{t('timeline.hover_now', lang, mib=number(a, ',.1f', lang))}<br>"
            f"{t('timeline.hover_high', lang, mib=number(b, ',.1f', lang))}"
            for point, a, b in zip(points, now, high)
        ]
        figure.add_trace(
            go.Scatter(
                x=[*xs, ends[-1]],
                y=[*high, high[-1]],
                mode="lines",
                line={"shape": "hv", "dash": "dot", "width": 2, "color": color},
                name=t("timeline.legend_high", lang, setting=name),
                legendgroup=name,
                hoverinfo="skip",
            )
        )
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=now,
                mode="lines+markers",
                line={"width": 3.5 if first else 2.5, "color": color},
                marker={"size": 7},
                name=t("timeline.legend_now", lang, setting=name),
                legendgroup=name,
                hovertext=hover,
                hoverinfo="text",
            )
        )
        peak = tl.peak_index(points)
        # A star at each peak and a short label in the setting's colour (the page says what caused it).
        x_peak = (xs[peak] + ends[peak]) / 2
        figure.add_trace(
            go.Scatter(
                x=[x_peak],
                y=[high[peak]],
                mode="markers",
                showlegend=False,
                hoverinfo="skip",
                marker={"symbol": "star", "size": 15, "color": color, "line": {"color": "white", "width": 1}},
            )
        )
        near_end = x_peak > 0.8 * tl.end_position(layers, tl.micro_batches(points))
        figure.add_annotation(  # beside its star (left of it near the right edge); equal peaks split up and down
            x=x_peak,
            y=high[peak],
            showarrow=False,
            yanchor="middle",
            yshift=11 if first else -11,
            xanchor="right" if near_end else "left",
            xshift=-12 if near_end else 12,
            text=f"<b>{t('timeline.peak_note', lang, mib=number(high[peak], ',.1f', lang))}</b>",
            font={"size": 13, "color": color},
            bgcolor=LEGEND_BACKGROUND,
        )

    if cursor is not None:
        points = memory_of(run).timeline
        cursor = min(max(cursor, 0), len(points) - 1)
        x = tl.positions(points, layers)[cursor]
        figure.add_vline(x=x, line={"color": CURSOR_COLOR, "width": 2, "dash": "dash"})
        figure.add_trace(
            go.Scatter(
                x=[x],
                y=[_above(run, points[cursor].current_bytes)],
                mode="markers",
                showlegend=False,
                hoverinfo="skip",
                marker={"size": 16, "color": CURSOR_COLOR, "symbol": "diamond"},
            )
        )

    tick_vals, tick_text = _ticks(layers, lang)
    figure.update_layout(
        title=heading(t("timeline.title", lang), provenance_label(run.provenance, lang), size=20),
        height=height,
        margin={"l": 60, "r": 20, "t": 108, "b": 60},
        legend=legend(-0.14, font={"size": 13}),
        **on_white(14, lang),
        hoverlabel={"font": {"size": 14}},
    )
    figure.update_xaxes(
        tickvals=tick_vals,
        ticktext=tick_text,
        range=[
            -0.3,
            max(tl.end_position(layers, tl.micro_batches(memory_of(each).timeline)) for each in (run, *others)) + 0.3,
        ],
        showgrid=False,
        tickfont={"size": 12 if layers <= 8 else 10},
        fixedrange=True,
    )
    figure.update_yaxes(
        title={"text": t("timeline.y_title", lang)},
        gridcolor=WASH_GRID,
        rangemode="tozero",
        range=[
            min(0.0, *(_above(e, p.current_bytes) for e, _ in series for p in memory_of(e).timeline)),
            top * 1.22 or 1,
        ],
        fixedrange=True,
    )
    return figure


def _band_extents(spans: Sequence[tl.Span]) -> dict[str, tuple[float, float]]:
    extents: dict[str, tuple[float, float]] = {}
    for span in spans:
        start, end = extents.get(span.band, (span.start, span.end))
        extents[span.band] = (min(start, span.start), max(end, span.end))
    if "backward" in extents and "rerun" in extents:
        start, end = extents["backward"]
        extents["backward"] = (min(start, extents["rerun"][0]), max(end, extents["rerun"][1]))
    return extents


def _ticks(layers: int, lang: str) -> tuple[list[float], list[str]]:
    every = 1 if layers <= 12 else (layers + 11) // 12
    values, text = [0.0], [t("tick.embeddings", lang)]
    for layer in range(0, layers, every):
        values.append(tl.position("layer_forward", layer, layers))
        text.append(f"L{layer + 1}")
    values.append(tl.position("loss", None, layers))
    text.append(t("tick.loss", lang))
    for layer in range(layers - 1, -1, -every):
        values.append(tl.position("layer_backward", layer, layers) + 0.5)
        text.append(f"L{layer + 1}")
    return values, text


def step_figure(run: RunResult, index: int, *, lang: str = "en", height: int = 400) -> go.Figure:
    """One moment of the step: what each layer holds (bars, coloured by state) and the memory in use.

    Bar heights are measured bytes: a layer's saved activations, a CP layer's input, and
    during a rerun the input plus how far memory rose in that stretch (see
    :func:`ckptlab.step.timeline.layer_bytes`).

    Raises:
        IndexError: ``index`` is outside the run's timeline.
    """
    points = memory_of(run).timeline
    roles = [layer.enabled for layer in run.layers]
    states = tl.layer_states(points, roles, index)
    values = [value / MIB for value in tl.layer_bytes(states, run.layers, points[index])]
    point = points[index]
    figure = go.Figure()
    for state in tl.STATES:
        xs = [f"L{layer + 1}" for layer, each in enumerate(states) if each == state]
        if not xs:
            continue
        ys = [values[layer] for layer, each in enumerate(states) if each == state]
        figure.add_trace(
            go.Bar(
                x=xs,
                y=ys,
                name=t(f"state.{state}", lang),
                marker={"color": STATE_COLORS[state], "line": {"color": OUTLINE_GREY, "width": 1}},
                text=[t(f"state.short_{state}", lang) for _ in xs],
                textposition="outside",
                textfont={"size": 13},
                hovertemplate="%{x}: %{y:,.2f} MiB<extra>" + t(f"state.{state}", lang) + "</extra>",
            )
        )
    now = _above(run, point.current_bytes)
    top = max([layer.saved_bytes / MIB for layer in run.layers] + values, default=0)
    figure.update_layout(
        title=heading(
            t("step.title", lang, i=index + 1, n=len(points), event=event_label(point, lang)),
            t("step.subtitle", lang, now=number(now, ",.1f", lang), setting=run_label(run, lang)),
            size=19,
        ),
        height=height,
        barmode="group",
        margin={"l": 60, "r": 10, "t": 90, "b": 40},
        legend=legend(-0.1, font={"size": 13}, traceorder="normal"),
        **on_white(14, lang),
    )
    figure.update_xaxes(categoryorder="array", categoryarray=[f"L{i + 1}" for i in range(len(states))], fixedrange=True)
    figure.update_yaxes(
        title={"text": t("step.y_title", lang)}, gridcolor=GRID, range=[0, (top or 1) * 1.25], fixedrange=True
    )
    return figure
