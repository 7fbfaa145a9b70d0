"""Measured runs side by side, as bars: a run beside checkpointing off, several settings, offload's share.

The memory bars are bytes above the baseline (what the step added to the parameters); the
time bars are medians, their whiskers the fastest and slowest of the repeats. Among several
settings, a step time within the noise of checkpointing off's is grey and says so
(:func:`ckptlab.results.judge_time`).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...errors import SpecError
from ...results import RunResult, judge_time, memory_of, timing_of
from ...units import MIB
from ..i18n import number, t
from ..labels import run_label, setting_label, short_setting_label
from ._style import (
    CATEGORY_COLORS,
    EXTRA_COLORS,
    GRID,
    LIGHT_GREY,
    NOISE_GREY,
    OFF_COLOR,
    OUTLINE_GREY,
    PEAK_COLOR,
    RUN_COLOR,
    TEXT_GREY,
    column_px,
    heading,
    legend,
    on_white,
    whiskers,
    wrapped,
)


def comparison_figure(result: RunResult, baseline: RunResult | None, lang: str = "en") -> go.Figure:
    """Memory and time of a run next to the same run with checkpointing off.

    Args:
        result: the run (must have measurements).
        baseline: the checkpointing-off run, or ``None`` / the run itself when there is none to show.

    Returns:
        Two bar panels, MiB and ms; the time bars carry the fastest-to-slowest spread of the repeats.

    Raises:
        ValueError: if ``result`` has no measurements (it did not fit).
    """
    if result.memory is None or result.timing is None:
        raise SpecError(key="api.no_measurements_to_chart", status=result.status)
    checkpointed = result.spec.checkpointing
    series = [(run_label(result, lang), result.memory, result.timing, RUN_COLOR if checkpointed else OFF_COLOR)]
    if checkpointed and baseline is not None and baseline.memory is not None and baseline.timing is not None:
        series.append((setting_label(None, False, lang), baseline.memory, baseline.timing, OFF_COLOR))

    # Wrapped: at 1280x720 the panel's title is wider than its panel and runs into the axis labels.
    panels = (wrapped(t("fig.memory_panel", lang), 22), wrapped(t("fig.time_panel", lang), 22))
    figure = make_subplots(rows=1, cols=2, subplot_titles=panels)
    memory_labels = [t("fig.after_forward", lang), t("fig.peak_of_step", lang)]
    time_labels = [t("fig.forward", lang), t("fig.backward", lang), t("fig.step", lang)]
    for name, memory, timing, color in series:
        memory_mib = [memory.after_forward_bytes / MIB, memory.peak_above_baseline_bytes / MIB]
        figure.add_trace(
            go.Bar(
                x=memory_labels,
                y=memory_mib,
                name=name,
                legendgroup=name,
                marker_color=color,
                text=[number(value, ",.1f", lang) for value in memory_mib],
                textposition="outside",
                hovertemplate="%{x}: %{y:,.1f} MiB<extra>" + name + "</extra>",
            ),
            row=1,
            col=1,
        )
        medians = [timing.forward_s, timing.backward_s, timing.step_s]
        samples = [timing.forward_samples, timing.backward_samples, timing.step_samples]
        figure.add_trace(
            go.Bar(
                x=time_labels,
                y=[value * 1000 for value in medians],
                name=name,
                legendgroup=name,
                showlegend=False,
                marker_color=color,
                error_y=whiskers(
                    [(max(s, default=m) - m) * 1000 for s, m in zip(samples, medians)],
                    [(m - min(s, default=m)) * 1000 for s, m in zip(samples, medians)],
                    TEXT_GREY,
                ),
                hovertemplate="%{x}: %{y:,.0f} ms " + t("fig.median", lang) + "<extra>" + name + "</extra>",
            ),
            row=1,
            col=2,
        )
    figure.update_layout(
        barmode="group",
        height=380,
        # room for the two-line category labels below, the two-line panel titles and the legend above
        margin={"l": 55, "r": 10, "t": 100, "b": 55},
        legend=legend(1.2, "bottom", font={"size": 14}),
        **on_white(14, lang),
    )
    figure.update_yaxes(gridcolor=GRID, rangemode="tozero")
    return figure


BAR_TEXT_PX = 13  # the numbers over the bars, never shrunk below it: they wrap to their bar instead
BAR_CHAR_PX = 7.5  # a character of it, on average


def runs_tradeoff_figure(
    runs: Sequence[RunResult], *, lang: str = "en", height: int = 360, width: int = column_px(0.6)
) -> go.Figure:
    """Memory held after the forward, peak, and step time of several settings side by side.

    The bars of a few measured runs; a sweep's trade-off (peak against step time, the Pareto
    frontier) is :func:`ckptlab.show.figures.tradeoff.sweep_tradeoff_figure`.

    Args:
        runs: measured runs of one model and shape (checkpointing off first reads best).
        width: pixels the page draws the figure in: the words over a bar wrap to its width.
    """
    # Wrapped: a panel's title wider than its panel reaches over the other panel's axis labels at 1280x720.
    panels = (wrapped(t("trade.memory_title", lang), 24), wrapped(t("trade.time_title", lang), 24))
    figure = make_subplots(rows=1, cols=2, subplot_titles=panels, horizontal_spacing=0.12)
    # Short, horizontal tick labels: the long setting names turn sideways and get cut in a half-width column.
    names = [short_setting_label(run.spec.every_n_layers, lang) for run in runs]
    colors = [
        OFF_COLOR if not run.spec.checkpointing else EXTRA_COLORS[i % len(EXTRA_COLORS)] if i > 1 else RUN_COLOR
        for i, run in enumerate(runs)
    ]
    # A setting's share of a panel (two panels, the margins and the spacing out), of which plotly gives a bar 80%:
    # the words over a bar wrap to it ("1,49 (noise)" as two lines), at BAR_TEXT_PX. Shrunk to fit, they were 5 px
    # tall and ran into each other (issue 58).
    slot_px = (width - 60) * (1 - 0.12) / 2 / max(len(runs), 1)
    time_chars = max(5, int(slot_px * 0.8 / BAR_CHAR_PX))
    memory: list[float] = []  # both memory bars' values, for the panel's range
    for key, getter in (
        ("trade.after_forward", lambda r: memory_of(r).after_forward_bytes),
        ("trade.peak", lambda r: memory_of(r).peak_above_baseline_bytes),
    ):
        values = [getter(run) / MIB for run in runs]
        memory += values
        figure.add_trace(
            go.Bar(
                x=names,
                y=values,
                name=t(key, lang),
                text=[number(v, ",.1f", lang) for v in values],
                textposition="outside",
                textfont={"size": BAR_TEXT_PX},
                marker={"color": CATEGORY_COLORS["activation"] if key == "trade.after_forward" else PEAK_COLOR},
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
                wrapped(t("tradeoff_fig.noise_point", lang, setting=number(v, ",.0f", lang)), time_chars)
                if grey
                else number(v, ",.0f", lang)
                for grey, v in zip(noise, times)
            ],
            textposition="outside",
            textfont={"size": BAR_TEXT_PX},
            error_y=whiskers(
                [(max(timing_of(run).step_samples) - timing_of(run).step_s) * 1000 for run in runs],
                [(timing_of(run).step_s - min(timing_of(run).step_samples)) * 1000 for run in runs],
                OUTLINE_GREY,
            ),
            showlegend=False,
            hovertemplate="%{x}: %{y:,.0f} ms<extra></extra>",
        ),
        row=1,
        col=2,
    )
    figure.update_layout(
        barmode="group",
        height=height,
        margin={"l": 50, "r": 10, "t": 90, "b": 50},  # the legend over the panels' two-line titles
        legend=legend(1.2, "bottom", font={"size": 13}),
        # Words over the bars keep their size (a bar narrower than them lets them spill, not shrink to 5 px).
        uniformtext={"minsize": BAR_TEXT_PX, "mode": "show"},
        **on_white(14, lang),
    )
    figure.update_yaxes(gridcolor=GRID, rangemode="tozero")
    figure.update_xaxes(tickangle=0, title={"text": "every_n_layers", "font": {"size": 12}})
    for col, values in ((1, memory), (2, times)):
        figure.update_yaxes(range=[0, max(values, default=0) * 1.22 or 1], row=1, col=col)
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
    for key, values, color in (("offload.moved", moved, CATEGORY_COLORS["host"]), ("offload.rest", rest, LIGHT_GREY)):
        figure.add_trace(
            go.Bar(
                x=labels,
                y=values,
                name=t(key, lang),
                marker={"color": color},
                text=[number(v, ",.1f", lang) for v in values],
                textposition="inside",
            )
        )
    figure.update_layout(
        barmode="stack",
        height=height,
        title=heading(t("offload.title", lang), size=18),
        margin={"l": 60, "r": 10, "t": 60, "b": 40},
        legend=legend(-0.12),
        **on_white(14, lang),
    )
    figure.update_yaxes(title={"text": "MiB"}, gridcolor=GRID, rangemode="tozero")
    return figure
