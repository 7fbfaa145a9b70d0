"""Pure Plotly builders for teaching: memory through a step, what each layer holds, and the trade.

Every figure is drawn from measured :class:`~ckptlab.RunResult` objects (their recorded
timeline, layer rows, memory and timing) and every word on it comes from the locale files
through :func:`ckptlab.show.i18n.t`, in the language passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..results import RunResult, judge_time, memory_of, timing_of
from ..step import timeline as tl
from ..units import MIB
from .figures import COLORS, FONT, OFF_COLOR, RUN_COLOR
from .i18n import t
from .noise import NOISE_GREY

BAND_COLORS = {
    "forward": "#56B4E9",
    "loss": "#999999",
    "backward": "#009E73",
    "rerun": COLORS["rerun"],
    "optimizer": "#E69F00",
}
STATE_COLORS = {
    "pending": "#E8E8E8",
    "running": "#56B4E9",
    "held": COLORS["keep"],
    "input_only": COLORS["CP"],
    "recomputing": COLORS["rerun"],
    "backward": "#009E73",
    "freed": "#BBBBBB",
}
EXTRA_COLORS = ("#CC79A7", "#009E73", "#F0E442", "#000000")  # further overlaid settings
CURSOR_COLOR = "#222222"


def setting_label(every_n_layers: int | None, offload: bool, lang: str) -> str:
    """ "every_n_layers=2", "every_n_layers=1, offload" or "checkpointing off", in ``lang``."""
    if every_n_layers is None:
        return t("setting.off", lang)
    return t("setting.on_offload" if offload else "setting.on", lang, n=every_n_layers)


def run_label(run: RunResult, lang: str) -> str:
    """The setting of a run, for a legend."""
    return setting_label(run.spec.every_n_layers, run.spec.offload, lang)


def provenance_label(run: RunResult, lang: str) -> str:
    """Where the numbers came from ("measured on the CPU (...)"), in ``lang``."""
    return t(f"provenance.{run.provenance.kind}", lang, device=run.provenance.device_name)


def method_label(method: str, lang: str) -> str:
    """How a number was measured (the meters' method strings), in ``lang``; an unknown method as it is."""
    from ..step import meters  # the method strings live with the meters that produce them

    keys = {
        meters.CPU_MEMORY_METHOD: "method.memory_cpu",
        meters.CUDA_MEMORY_METHOD: "method.memory_cuda",
        meters.CPU_TIME_METHOD: "method.time_cpu",
        meters.CUDA_TIME_METHOD: "method.time_cuda",
    }
    return t(keys[method], lang) if method in keys else method


def event_label(point: dict, lang: str) -> str:
    """An event of the timeline for people, e.g. "backward of L3: its rerun, then its gradients"."""
    layer = point.get("layer")
    return t(f"event.{point['kind']}", lang, n="" if layer is None else layer + 1)


def peak_cause(run: RunResult, lang: str) -> str:
    """Why the peak is where it is: the stretch, and the largest categories held there (where the meter tells)."""
    timeline = memory_of(run).timeline
    point = timeline[tl.peak_index(timeline)]
    where = event_label(point, lang)
    parts = sorted(
        (
            (value, key)
            for key, value in point.get("region_peak_breakdown", {}).items()
            if key not in ("parameter", "buffer")
        ),
        reverse=True,
    )[:2]
    if not parts:
        return where
    held = ", ".join(f"{t('category.' + key, lang)} {value / MIB:,.1f} MiB" for value, key in parts)
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
            raise ValueError(f"the run {each.spec} has no memory timeline to draw")
    layers = run.model.num_layers
    figure = go.Figure()
    for span in tl.phase_spans(memory_of(run).timeline, layers):
        figure.add_vrect(
            x0=span.start,
            x1=span.end,
            fillcolor=BAND_COLORS[span.band],
            opacity=0.28 if span.band == "rerun" else 0.12,
            line_width=0,
            layer="below",
        )
    for band, (start, end) in _band_extents(tl.phase_spans(memory_of(run).timeline, layers)).items():
        if band == "rerun":
            continue
        figure.add_annotation(  # a row of its own between the subtitle and the plot: peak labels sit inside
            x=(start + end) / 2,
            y=1.0,
            yref="paper",
            yanchor="bottom",
            showarrow=False,
            text=f"<b>{t('band.' + band, lang)}</b>",
            font={"size": 15, "color": BAND_COLORS[band] if band != "loss" else "#555555"},
        )
    if any(span.band == "rerun" for span in tl.phase_spans(memory_of(run).timeline, layers)):
        figure.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=t("timeline.legend_rerun", lang),
                marker={"symbol": "square", "size": 14, "color": BAND_COLORS["rerun"], "opacity": 0.5},
            )
        )

    series = [(run, RUN_COLOR if run.spec.checkpointing else OFF_COLOR)]
    for index, other in enumerate(others):
        color = OFF_COLOR if not other.spec.checkpointing else EXTRA_COLORS[index % len(EXTRA_COLORS)]
        series.append((other, color))
    top = 0.0
    for position_in_list, (each, color) in enumerate(series):
        points = memory_of(each).timeline
        xs = tl.positions(points, layers)
        ends = tl.stretch_ends(points, layers)
        name = run_label(each, lang)
        now = [_above(each, point["current_bytes"]) for point in points]
        high = [_above(each, point["region_peak_bytes"]) for point in points]
        top = max(top, *high)
        hover = [
            f"<b>{event_label(point, lang)}</b><br>{t('timeline.hover_now', lang, mib=f'{a:,.1f}')}<br>"
            f"{t('timeline.hover_high', lang, mib=f'{b:,.1f}')}"
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
                line={"width": 3.5 if position_in_list == 0 else 2.5, "color": color},
                marker={"size": 7},
                name=t("timeline.legend_now", lang, setting=name),
                legendgroup=name,
                hovertext=hover,
                hoverinfo="text",
            )
        )
        peak = tl.peak_index(points)
        # A star at each peak and a short label in the setting's colour (the page says what caused it).
        first = position_in_list == 0
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
        near_end = x_peak > 0.8 * tl.end_position(layers)
        figure.add_annotation(  # beside its star (left of it near the right edge); equal peaks split up and down
            x=x_peak,
            y=high[peak],
            showarrow=False,
            yanchor="middle",
            yshift=11 if first else -11,
            xanchor="right" if near_end else "left",
            xshift=-12 if near_end else 12,
            text=f"<b>{t('timeline.peak_note', lang, mib=f'{high[peak]:,.1f}')}</b>",
            font={"size": 13, "color": color},
            bgcolor="rgba(255,255,255,0.85)",
        )

    if cursor is not None:
        points = memory_of(run).timeline
        cursor = min(max(cursor, 0), len(points) - 1)
        x = tl.positions(points, layers)[cursor]
        figure.add_vline(x=x, line={"color": CURSOR_COLOR, "width": 2, "dash": "dash"})
        figure.add_trace(
            go.Scatter(
                x=[x],
                y=[_above(run, points[cursor]["current_bytes"])],
                mode="markers",
                showlegend=False,
                hoverinfo="skip",
                marker={"size": 16, "color": CURSOR_COLOR, "symbol": "diamond"},
            )
        )

    tick_vals, tick_text = _ticks(layers, lang)
    figure.update_layout(
        title={
            "text": t("timeline.title", lang),
            "subtitle": {"text": provenance_label(run, lang)},
            "x": 0,
            "xref": "paper",
            "font": {"size": 20},
        },
        height=height,
        margin={"l": 60, "r": 20, "t": 108, "b": 60},
        legend={"orientation": "h", "yanchor": "top", "y": -0.14, "x": 0, "font": {"size": 13}},
        font={"family": FONT, "size": 14},
        plot_bgcolor="white",
        hoverlabel={"font": {"size": 14}},
    )
    figure.update_xaxes(
        tickvals=tick_vals,
        ticktext=tick_text,
        range=[-0.3, tl.end_position(layers) + 0.3],
        showgrid=False,
        tickfont={"size": 12 if layers <= 8 else 10},
        fixedrange=True,
    )
    figure.update_yaxes(
        title={"text": t("timeline.y_title", lang)},
        gridcolor="#e5e5e5",
        rangemode="tozero",
        range=[
            min(0.0, *(_above(e, p["current_bytes"]) for e, _ in series for p in memory_of(e).timeline)),
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


def diagram_figure(
    roles: Sequence[str],
    *,
    lang: str = "en",
    focus: tuple[int, str] | None = None,
    reruns: Sequence[int] | None = None,
    height: int | None = None,
) -> go.Figure:
    """The CP / keep / rerun diagram, in ``lang``, with the layer at work outlined.

    Args:
        roles: per layer "CP" or "keep" (the forward row); the backward row says "rerun"
            where a layer reran (``reruns``, observed counts) or, without counts, where it is CP.
        lang: language of the labels.
        focus: ``(layer, "forward" | "backward")`` to outline; the other boxes fade.
        reruns: observed reruns per layer, from the run's layer rows.
        height: pixels; by default from the number of layers.
    """
    count = len(roles)
    back = ["rerun" if (reruns[i] if reruns is not None else role == "CP") else "keep" for i, role in enumerate(roles)]
    rows = [(t("diagram.forward", lang), list(roles), 0.0), (t("diagram.backward", lang), back, -1.0)]
    figure = go.Figure()
    for role in ("CP", "keep", "rerun"):
        xs, bases, texts, opacity, lines = [], [], [], [], []
        for row_index, (_, row_roles, y) in enumerate(rows):
            for layer, each in enumerate(row_roles):
                if each != role:
                    continue
                focused = focus is not None and focus[0] == layer and (focus[1] == "forward") == (row_index == 0)
                xs.append(layer)
                bases.append(y - 0.42)
                texts.append(f"L{layer + 1}<br><b>{each}</b>")
                opacity.append(1.0 if focus is None or focused else 0.45)
                lines.append(6 if focused else 2)
        if not xs:
            continue
        figure.add_trace(
            go.Bar(
                x=xs,
                y=[0.84] * len(xs),
                base=bases,
                width=0.86,
                name=t(f"diagram.legend_{role}", lang),
                marker={
                    "color": COLORS[role],
                    "opacity": opacity,
                    "line": {"color": [CURSOR_COLOR if w == 6 else "white" for w in lines], "width": lines},
                },
                text=texts,
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                textfont={"color": "white", "size": 18 if count <= 8 else 14, "family": FONT},
                hoverinfo="text",
                hovertext=[t(f"diagram.hover_{role}", lang, n=x + 1) for x in xs],
            )
        )
    longest = max(len(label) for label, _, _ in rows)
    figure.update_layout(
        barmode="overlay",
        height=height or 250,
        margin={"l": 20 + 9 * longest, "r": 10, "t": 10, "b": 50},
        legend={"orientation": "h", "yanchor": "top", "y": -0.02, "x": 0, "font": {"size": 14}},
        font={"family": FONT, "size": 14},
        plot_bgcolor="white",
        uniformtext={"minsize": 9, "mode": "show"},
    )
    figure.update_xaxes(visible=False, range=[-0.5, count - 0.5], fixedrange=True)
    figure.update_yaxes(
        tickvals=[0, -1],
        ticktext=[label for label, _, _ in rows],
        tickfont={"size": 15},
        range=[-1.5, 0.5],
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )
    return figure


def focus_of(point: dict) -> tuple[int, str] | None:
    """The layer at work at one event, and in which row of the diagram: None outside the layers."""
    if point["layer"] is None:
        return None
    return point["layer"], "backward" if point["phase"] == "backward" else "forward"


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
                marker={"color": STATE_COLORS[state], "line": {"color": "#666666", "width": 1}},
                text=[t(f"state.short_{state}", lang) for _ in xs],
                textposition="outside",
                textfont={"size": 13},
                hovertemplate="%{x}: %{y:,.2f} MiB<extra>" + t(f"state.{state}", lang) + "</extra>",
            )
        )
    now = _above(run, point["current_bytes"])
    top = max((layer.saved_bytes for layer in run.layers), default=0) / MIB
    top = max(top, *values) if values else top
    figure.update_layout(
        title={
            "text": t("step.title", lang, i=index + 1, n=len(points), event=event_label(point, lang)),
            "subtitle": {"text": t("step.subtitle", lang, now=f"{now:,.1f}", setting=run_label(run, lang))},
            "x": 0,
            "xref": "paper",
            "font": {"size": 19},
        },
        height=height,
        barmode="group",
        margin={"l": 60, "r": 10, "t": 90, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.1, "x": 0, "font": {"size": 13}, "traceorder": "normal"},
        font={"family": FONT, "size": 14},
        plot_bgcolor="white",
    )
    figure.update_xaxes(categoryorder="array", categoryarray=[f"L{i + 1}" for i in range(len(states))], fixedrange=True)
    figure.update_yaxes(
        title={"text": t("step.y_title", lang)}, gridcolor="#e5e5e5", range=[0, (top or 1) * 1.25], fixedrange=True
    )
    return figure


def tradeoff_figure(runs: Sequence[RunResult], *, lang: str = "en", height: int = 360) -> go.Figure:
    """Memory held after the forward, peak, and step time of several settings side by side.

    Args:
        runs: measured runs of one model and shape (checkpointing off first reads best).
    """
    panels = (t("trade.memory_title", lang), t("trade.time_title", lang))
    figure = make_subplots(rows=1, cols=2, subplot_titles=panels, horizontal_spacing=0.12)
    # Short, horizontal tick labels: the long setting names turn sideways and get cut in a half-width column.
    names = [
        t("setting.short_off", lang) if run.spec.every_n_layers is None else f"n={run.spec.every_n_layers}"
        for run in runs
    ]
    colors = [
        OFF_COLOR if not run.spec.checkpointing else EXTRA_COLORS[i % len(EXTRA_COLORS)] if i > 1 else RUN_COLOR
        for i, run in enumerate(runs)
    ]
    for key, getter in (
        ("trade.after_forward", lambda r: memory_of(r).after_forward_bytes),
        ("trade.peak", lambda r: memory_of(r).peak_above_baseline_bytes),
    ):
        values = [getter(run) / MIB for run in runs]
        figure.add_trace(
            go.Bar(
                x=names,
                y=values,
                name=t(key, lang),
                text=[f"{v:,.1f}" for v in values],
                textposition="outside",
                marker={"color": "#0072B2" if key == "trade.after_forward" else "#999999"},
                hovertemplate="%{x}: %{y:,.1f} MiB<extra>" + t(key, lang) + "</extra>",
            ),
            row=1,
            col=1,
        )
    times = [timing_of(run).step_s * 1000 for run in runs]
    # The same verdict as everywhere (results.judge_time): a step time within the noise of
    # checkpointing off's is grey and says so; the whiskers are the fastest and slowest step.
    off = next((run for run in runs if not run.spec.checkpointing), None)
    noise = [
        off is not None
        and run is not off
        and judge_time(timing_of(run).step_samples, timing_of(off).step_samples).noise
        for run in runs
    ]
    figure.add_trace(
        go.Bar(
            x=names,
            y=times,
            name=t("trade.step", lang),
            marker={"color": [NOISE_GREY if grey else color for grey, color in zip(noise, colors)]},
            text=[
                t("tradeoff_fig.noise_point", lang, setting=f"{v:,.0f}") if grey else f"{v:,.0f}"
                for grey, v in zip(noise, times)
            ],
            textposition="outside",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [(max(timing_of(run).step_samples) - timing_of(run).step_s) * 1000 for run in runs],
                "arrayminus": [(timing_of(run).step_s - min(timing_of(run).step_samples)) * 1000 for run in runs],
                "color": "#666666",
            },
            showlegend=False,
            hovertemplate="%{x}: %{y:,.0f} ms<extra></extra>",
        ),
        row=1,
        col=2,
    )
    figure.update_layout(
        barmode="group",
        height=height,
        margin={"l": 50, "r": 10, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.12, "x": 0, "font": {"size": 13}},
        font={"family": FONT, "size": 14},
        plot_bgcolor="white",
    )
    figure.update_yaxes(gridcolor="#e5e5e5", rangemode="tozero")
    figure.update_xaxes(tickangle=0, title={"text": "every_n_layers", "font": {"size": 12}})
    for axis in ("yaxis", "yaxis2"):
        top = max(
            (trace.y and max(v for v in trace.y if v is not None)) or 0
            for trace in figure.data
            if (trace.yaxis or "y") == ("y" if axis == "yaxis" else "y2")
        )
        figure.layout[axis].range = [0, top * 1.22 or 1]
    return figure


def offload_figure(runs: Sequence[RunResult], *, lang: str = "en", height: int = 340) -> go.Figure:
    """What offload would move off a GPU, against everything else resident after the forward, per sequence length.

    Args:
        runs: checkpointed runs of one model at growing sequence lengths.
    """
    labels = [t("offload.seq", lang, seq=run.spec.seq_len) for run in runs]
    moved = [memory_of(run).offload_bytes / MIB for run in runs]
    rest = [max(memory_of(run).after_forward_bytes - memory_of(run).offload_bytes, 0) / MIB for run in runs]
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=labels,
            y=moved,
            name=t("offload.moved", lang),
            marker={"color": COLORS["CP"]},
            text=[f"{v:,.1f}" for v in moved],
            textposition="inside",
        )
    )
    figure.add_trace(
        go.Bar(
            x=labels,
            y=rest,
            name=t("offload.rest", lang),
            marker={"color": "#BBBBBB"},
            text=[f"{v:,.1f}" for v in rest],
            textposition="inside",
        )
    )
    figure.update_layout(
        barmode="stack",
        height=height,
        title={"text": t("offload.title", lang), "x": 0, "xref": "paper", "font": {"size": 18}},
        margin={"l": 60, "r": 10, "t": 60, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.12, "x": 0},
        font={"family": FONT, "size": 14},
        plot_bgcolor="white",
    )
    figure.update_yaxes(title={"text": "MiB"}, gridcolor="#e5e5e5", rangemode="tozero")
    return figure


def prediction_figure(
    predicted: float, measured: float, *, lang: str = "en", unit: str = "%", height: int = 260
) -> go.Figure:
    """A participant's prediction beside the measurement (an exercise's answer), 100 marking checkpointing off."""
    labels = [t("exercise.your_prediction", lang), t("exercise.measured", lang)]
    # Explicit room for the labels: Streamlit's plotly.js cuts them off with automargin alone (see figures.py).
    label_px = 20 + 9 * max(len(label) for label in labels) * (2 if lang == "ja" else 1)
    figure = go.Figure(
        go.Bar(
            y=labels,
            x=[predicted, measured],
            orientation="h",
            marker={"color": ["#CC79A7", RUN_COLOR]},
            text=[f"{predicted:,.0f}{unit}", f"{measured:,.0f}{unit}"],
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
        font={"family": FONT, "size": 15},
        plot_bgcolor="white",
        showlegend=False,
    )
    figure.update_xaxes(range=[0, top * 1.2 or 1], gridcolor="#e5e5e5", fixedrange=True)
    figure.update_yaxes(autorange="reversed", fixedrange=True)
    return figure
