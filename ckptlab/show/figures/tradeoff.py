"""The trade-off explorer's figures: a sweep (and the formula's prediction) in, a figure out.

Every figure says where its numbers come from in its subtitle (measured on the CPU or on
CUDA), and every predicted trace is named "predicted (...)" and drawn dashed, so a
prediction never passes for a measurement. The sentence that explains where a configuration's
peak is and why checkpointing did or did not lower it is in :mod:`ckptlab.show.peak_words`; the
measured bars beside the formula's are in :mod:`ckptlab.show.figures.prediction`.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...explore.predict import resident_by_setting
from ...explore.recommend import Recommendation
from ...explore.sweep import SweepResult
from ...explore.sweep_rows import known, known_peak, known_step, pareto_rows
from ...fact import Fact
from ...model import catalog
from ...units import MIB, mib
from ..i18n import t
from ..labels import event_label, provenance_label
from ..peak_words import peak_where
from ._style import (
    BLACK,
    BUDGET_COLOR,
    FRONTIER_COLOR,
    GREY,
    GRID,
    LIGHT_GRID,
    MEASURED_COLOR,
    NOISE_GREY,
    SERIES_COLORS,
    SETTING_COLORS,
    heading,
    legend,
    on_white,
    whiskers,
)

# The Pareto figure's marker for each selective policy of a sweep, in the order the sweep measured them.
POLICY_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "cross")
# The Pareto plot's area in pixels on the Trade-offs page at 1280x720 (the narrowest it is drawn: the figure's
# 480 px less its margins; the page's width less the sidebar and the margins), where its point labels are placed.
PARETO_PLOT_PX = (520, 270)
LABEL_PX = 13  # the labels' font (on_white(13)): a character about 0.6 of it wide, a line 1.3 of it tall
# Where a point's label may go, in the order tried: plotly's textposition and the box's corner from the point.
LABEL_PLACES = ("top center", "bottom center", "middle right", "middle left", "top right", "top left")


def label_positions(
    points: Sequence[tuple[float, float, str]],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    avoid_y: float | None = None,
    plot_px: tuple[int, int] = PARETO_PLOT_PX,
) -> list[str]:
    """A textposition for each point's label so that no two labels, no label and another point, and no label and
    the line at ``avoid_y`` (the budget, with its label at the top right) meet, where a place is free: each label
    takes the first free place of :data:`LABEL_PLACES`, points from the top down; a label with none keeps the first.

    Args:
        points: (x, y, label) in data units.
        x_range, y_range: the axes' ranges in data units.
        avoid_y: a horizontal line's height in data units.
        plot_px: the plot area's width and height in pixels.
    """
    places = _placed(points, x_range, y_range, avoid_y, plot_px, keep_unplaced=True)
    return [place or LABEL_PLACES[0] for place in places]


def free_label_positions(
    points: Sequence[tuple[float, float, str]],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    avoid_y: float | None = None,
    plot_px: tuple[int, int] = PARETO_PLOT_PX,
) -> list[str | None]:
    """As :func:`label_positions`, but None for a label with no free place: a figure whose points crowd (settings a
    layer apart at scale) leaves those labels out, to its hover, rather than write one over another."""
    return _placed(points, x_range, y_range, avoid_y, plot_px, keep_unplaced=False)


def _placed(
    points: Sequence[tuple[float, float, str]],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    avoid_y: float | None,
    plot_px: tuple[int, int],
    keep_unplaced: bool,
) -> list[str | None]:
    width, height = plot_px
    x_scale = width / ((x_range[1] - x_range[0]) or 1.0)
    y_scale = height / ((y_range[1] - y_range[0]) or 1.0)
    centres = [((x - x_range[0]) * x_scale, (y_range[1] - y) * y_scale) for x, y, _ in points]  # y down, as drawn
    marker = 7.0  # half a marker (size 11) and plotly's gap
    taken = [(cx - marker, cy - marker, cx + marker, cy + marker) for cx, cy in centres]
    if avoid_y is not None:
        line_y = (y_range[1] - avoid_y) * y_scale
        taken.append((-1e9, line_y - 2, 1e9, line_y + 2))
        taken.append((width - 0.6 * LABEL_PX * 24, line_y - 1.4 * LABEL_PX, width, line_y))  # its label, top right
    chosen: list[str | None] = [LABEL_PLACES[0] if keep_unplaced else None] * len(points)
    for index in sorted(range(len(points)), key=lambda i: centres[i][1]):
        box_width, box_height = 0.6 * LABEL_PX * len(points[index][2]), 1.3 * LABEL_PX
        for place in LABEL_PLACES:
            box = label_box(centres[index], place, box_width, box_height, marker)
            inside = box[0] >= 0 and box[2] <= width and box[1] >= 0 and box[3] <= height
            if inside and not any(_meet(box, other) for other in taken):
                chosen[index] = place
                break
        at = chosen[index]
        if at is not None:
            taken.append(label_box(centres[index], at, box_width, box_height, marker))
    return chosen


def label_box(
    centre: tuple[float, float], place: str, width: float, height: float, gap: float
) -> tuple[float, float, float, float]:
    """The pixel box (left, top, right, bottom) of a label at ``place`` around a point at ``centre``."""
    cx, cy = centre
    vertical, horizontal = place.split()
    top = {"top": cy - gap - height, "bottom": cy + gap, "middle": cy - height / 2}[vertical]
    left = {"center": cx - width / 2, "right": cx + gap, "left": cx - gap - width}[horizontal]
    return left, top, left + width, top + height


def _meet(one: tuple[float, float, float, float], other: tuple[float, float, float, float]) -> bool:
    return one[0] < other[2] and other[0] < one[2] and one[1] < other[3] and other[1] < one[3]


def sweep_provenance_label(result: SweepResult, lang: str = "en") -> str:
    """e.g. "measured on the CPU (Intel Xeon, 2 cores)", from the sweep's first measured row.

    Rows without their run (a table made by hand) say the kind alone, "measured on CUDA".
    """
    for row in result.rows:
        if row.result is not None:
            return provenance_label(row.result.provenance, lang)
    kind = min((row.provenance for row in result.rows), default="")
    if kind in ("measured-cuda", "measured-cpu"):
        return provenance_label(kind, lang)
    return t("tradeoff_fig.measured", lang)


def sweep_tradeoff_figure(
    result: SweepResult, seq_len: int, recommendation: Recommendation | None = None, lang: str = "en"
) -> go.Figure:
    """Peak memory against step time, one point per configuration of a sweep, the Pareto frontier drawn.

    A few runs' memory and time as bars side by side are :func:`ckptlab.show.figures.run.runs_tradeoff_figure`.

    Args:
        result: a sweep.
        seq_len: the sequence length whose rows are drawn.
        recommendation: when given, its budget is a horizontal line and its row is highlighted.

    Returns:
        A scatter: x the median step time (ms, bars: fastest to slowest step), y the peak
        over the step (MiB, baseline included: what has to fit). A point whose step time is
        within the noise of checkpointing off's (``SweepRow.time_is_noise``) is grey and says so.
    """
    rows = [row for row in result.rows_at(seq_len) if row.step_s is not None]
    figure = go.Figure()
    # Each point's label where it meets no other label, point or the budget line (issue 43: "n=… (noise)" labels
    # over each other and over the line). A point in the noise says so by its grey and the legend, not in words.
    budget_y = recommendation.budget_bytes / MIB if recommendation is not None else None
    steps = [known_step(r) for r in rows]
    x_low = min(
        (min(known(r.step_min_s, r, Fact("row_figure.fastest_step")), s) * 1000 for r, s in zip(rows, steps)),
        default=0.0,
    )
    x_high = max(
        (max(known(r.step_max_s, r, Fact("row_figure.slowest_step")), s) * 1000 for r, s in zip(rows, steps)),
        default=1.0,
    )
    y_high = max([known_peak(r) / MIB for r in rows] + ([budget_y] if budget_y else []), default=1.0)
    pad = (x_high - x_low) * 0.08 or 1.0
    x_range, y_range = (x_low - pad, x_high + pad), (0.0, y_high * 1.12)  # drawn so: the labels' places assume them
    places = dict(
        zip(
            [id(row) for row in rows],
            label_positions(
                [(known_step(r) * 1000, known_peak(r) / MIB, r.setting) for r in rows],
                x_range,
                y_range,
                budget_y,
            ),
        )
    )
    # One trace per selective policy, each its own marker, so that a sweep over policies tells them apart
    # (checkpointing off is plain: it sits with "none"); one policy keeps the one trace it always had.
    policies = list(dict.fromkeys(row.selective for row in rows))
    for index, policy in enumerate(policies):
        group = [row for row in rows if row.selective == policy]
        name = t("tradeoff_fig.configuration", lang)
        color = MEASURED_COLOR
        if len(policies) > 1:
            name = t("tradeoff_fig.policy_trace", lang, policy=policy)
            color = SERIES_COLORS[index % len(SERIES_COLORS)]
        figure.add_trace(
            go.Scatter(
                x=[known_step(row) * 1000 for row in group],
                y=[known_peak(row) / MIB for row in group],
                mode="markers+text",
                text=[row.setting for row in group],
                textposition=[places[id(row)] for row in group],
                textfont={"color": [NOISE_GREY if row.time_is_noise else BLACK for row in group]},
                name=name,
                marker={
                    "size": 11,
                    "symbol": POLICY_SYMBOLS[index % len(POLICY_SYMBOLS)],
                    "color": [NOISE_GREY if row.time_is_noise else color for row in group],
                },
                error_x=whiskers(
                    [
                        (known(row.step_max_s, row, Fact("row_figure.slowest_step")) - known_step(row)) * 1000
                        for row in group
                    ],
                    [
                        (known_step(row) - known(row.step_min_s, row, Fact("row_figure.fastest_step"))) * 1000
                        for row in group
                    ],
                    GREY,
                ),
                customdata=[
                    [
                        peak_where(row, lang),
                        known(row.after_forward_bytes, row, Fact("row_figure.resident_bytes")) / MIB,
                    ]
                    for row in group
                ],
                hovertemplate=_point_hover(lang),
            )
        )
    if any(row.time_is_noise for row in rows):
        figure.add_trace(  # a legend entry for the grey points
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker={"size": 11, "color": NOISE_GREY},
                name=t("tradeoff_fig.noise_legend", lang),
                hoverinfo="skip",
            )
        )
    frontier = pareto_rows(rows)
    if frontier:
        # One point when a single setting is both fastest and smallest (short sequences: the peak is
        # the gradients' and every setting has it), still drawn and named.
        figure.add_trace(
            go.Scatter(
                x=[known_step(row) * 1000 for row in frontier],
                y=[known_peak(row) / MIB for row in frontier],
                mode="lines+markers",
                marker={"size": 17, "symbol": "circle-open", "color": FRONTIER_COLOR, "line": {"width": 2}},
                line={"color": FRONTIER_COLOR, "width": 2, "shape": "hv"},
                name=t("tradeoff_fig.frontier", lang),
                hoverinfo="skip",
            )
        )
    if recommendation is not None:
        figure.add_hline(
            y=recommendation.budget_bytes / MIB,
            line={"color": BUDGET_COLOR, "dash": "dash", "width": 1.5},
            annotation_text=t("tradeoff_fig.budget", lang, budget=recommendation.budget_label),
            # Top right: over the slow settings, which are the small ones; the fast, big ones sit at the left.
            annotation_position="top right",
        )
        if recommendation.row is not None and recommendation.row.seq_len == seq_len:
            chosen = recommendation.row
            key = (
                "tradeoff_fig.recommended_predicted"
                if recommendation.ranked_by == "predicted"
                else "tradeoff_fig.recommended"
            )
            figure.add_trace(
                go.Scatter(
                    x=[known_step(chosen) * 1000],
                    y=[known_peak(chosen) / MIB],
                    mode="markers",
                    marker={
                        "symbol": "star",
                        "size": 22,
                        "color": FRONTIER_COLOR,
                        "line": {"color": "black", "width": 1},
                    },
                    name=t(key, lang, setting=chosen.setting),
                    hovertemplate=t("tradeoff_fig.recommended_hover", lang, setting=chosen.setting) + "<extra></extra>",
                )
            )
    sweep_layout(
        figure,
        lang,
        t("tradeoff_fig.tradeoff_title", lang, model=result.model, seq=seq_len),
        sweep_provenance_label(result, lang),
        x_title=t("tradeoff_fig.tradeoff_x", lang),
        y_title=t("tradeoff_fig.tradeoff_y", lang),
    )
    figure.update_xaxes(range=list(x_range))
    figure.update_yaxes(range=list(y_range))
    return figure


def seq_len_figure(result: SweepResult, up_to: int | None = None, lang: str = "en") -> go.Figure:
    """Memory against sequence length for off, full (n=1), partial and offload.

    Measured rows are markers on solid lines; the formula's prediction continues each series
    (dashed, "predicted") up to ``up_to`` tokens (default 4x the longest measured), which is
    where checkpointing becomes necessary. Offload not measured (on the CPU) is predicted only.

    Returns:
        Two panels: resident after the forward, and peak over the step (measured only).
    """
    seq_lens = sorted({row.seq_len for row in result.rows})
    up_to = up_to or 4 * max(seq_lens, default=512)
    settings = _series_settings(result, lang)
    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(t("tradeoff_fig.resident_panel", lang), t("tradeoff_fig.peak_panel", lang)),
        horizontal_spacing=0.1,
    )
    first = next((row.result for row in result.rows if row.result is not None), None)
    max_positions = catalog.describe(result.spec.model).max_positions or up_to
    predicted_lens = sorted(set(seq_lens) | set(_doublings(min(seq_lens, default=128), min(up_to, max_positions))))
    predicted = (
        {}
        if first is None
        else resident_by_setting(
            result.spec.model,
            result.spec.batch_size,
            result.spec.mixed_precision,
            first.dtype,
            result.device.split(":")[0],
            predicted_lens,
            sorted({n for _, _, n, _ in settings if n is not None}),
        )
    )
    hover = t("tradeoff_fig.seq_hover", lang, seq="%{x}", mib="%{y:,.1f}")
    for kind, label, n, offload in settings:
        color = SETTING_COLORS[kind]
        measured = [
            row
            for row in result.rows
            if row.every_n_layers == n and row.offload == offload and row.after_forward_bytes is not None
        ]
        if measured:
            for col, values in (
                (1, [known(row.after_forward_bytes, row, Fact("row_figure.resident_bytes")) for row in measured]),
                (2, [known_peak(row) for row in measured]),
            ):
                name = t("tradeoff_fig.series_measured", lang, label=label)
                figure.add_trace(
                    go.Scatter(
                        x=[row.seq_len for row in measured],
                        y=[v / MIB for v in values],
                        mode="lines+markers",
                        name=name,
                        legendgroup=label,
                        showlegend=col == 1,
                        line={"color": color},
                        hovertemplate=hover + "<extra>" + name + "</extra>",
                    ),
                    row=1,
                    col=col,
                )
        if (n, offload) in predicted:
            name = t("tradeoff_fig.series_predicted", lang, label=label)
            figure.add_trace(
                go.Scatter(
                    x=predicted_lens,
                    y=[value / MIB for value in predicted[(n, offload)]],
                    mode="lines",
                    name=name,
                    legendgroup=label,
                    line={"color": color, "dash": "dash"},
                    hovertemplate=hover + "<extra>" + name + "</extra>",
                ),
                row=1,
                col=1,
            )
    sweep_layout(
        figure,
        lang,
        t("tradeoff_fig.seq_title", lang, model=result.model),
        t("tradeoff_fig.seq_subtitle", lang, provenance=sweep_provenance_label(result, lang)),
        x_title=t("tradeoff_fig.seq_x", lang),
    )
    figure.update_xaxes(type="log")
    return figure


def sweep_peak_figure(result: SweepResult, seq_len: int, lang: str = "en") -> go.Figure:
    """Memory through the step for each configuration of a sweep, its peak marked where it happened.

    What a GPU holds at the peak, by category, is :func:`ckptlab.show.figures.scale.scale_peak_figure`.

    Returns:
        One line per configuration over the step's events (forward, loss, backward and
        reruns), x the position in the step from 0 (start) to 1 (end), with a marker at
        the highest point and the stretch named in the hover.
    """
    figure = go.Figure()
    drawn = [
        (row, row.result.memory.timeline)
        for row in result.rows_at(seq_len)
        if row.result is not None and row.result.memory is not None
    ]
    for index, (row, timeline) in enumerate(drawn):
        if not timeline:
            continue
        color = SERIES_COLORS[index % len(SERIES_COLORS)]
        last = max(len(timeline) - 1, 1)
        x = [point.order / last for point in timeline]
        y = [max(point.current_bytes, point.region_peak_bytes) / MIB for point in timeline]
        figure.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=row.setting,
                legendgroup=row.setting,
                line={"color": color, "width": 1.5},
                text=[event_label(point, lang) for point in timeline],
                hovertemplate="%{text}: %{y:,.1f} MiB<extra>" + row.setting + "</extra>",
            )
        )
        top = max(range(len(y)), key=y.__getitem__)
        figure.add_trace(
            go.Scatter(
                x=[x[top]],
                y=[known_peak(row) / MIB],
                mode="markers",
                legendgroup=row.setting,
                showlegend=False,
                marker={"color": color, "size": 10, "symbol": "triangle-up"},
                hovertemplate=t(
                    "tradeoff_fig.peak_hover",
                    lang,
                    setting=row.setting,
                    mib=mib(known_peak(row), lang),
                    where=peak_where(row, lang),
                )
                + "<extra></extra>",
            )
        )
    sweep_layout(
        figure,
        lang,
        t("tradeoff_fig.peak_title", lang, model=result.model, seq=seq_len),
        sweep_provenance_label(result, lang),
        x_title=t("tradeoff_fig.peak_x", lang),
        y_title=t("tradeoff_fig.peak_y", lang),
    )
    return figure


def sweep_layout(
    figure: go.Figure, lang: str, title: str, subtitle: str, x_title: str | None = None, y_title: str | None = None
) -> None:
    """The layout every sweep figure shares: title and provenance subtitle, the legend under the axis title."""
    figure.update_layout(
        title=heading(title, subtitle),
        height=480,
        margin={"l": 60, "r": 20, "t": 90, "b": 120},  # the legend sits below the axis title
        legend=legend(-0.2),
        **on_white(13, lang),
    )
    figure.update_yaxes(gridcolor=GRID, rangemode="tozero", title_text=y_title)
    figure.update_xaxes(gridcolor=LIGHT_GRID, title_text=x_title)


def _point_hover(lang: str) -> str:
    """The hover of a point of the trade-off figure: its setting, time, memory and where the peak was."""
    return (
        t(
            "tradeoff_fig.point_hover",
            lang,
            setting="%{text}",
            step="%{x:,.0f}",
            peak="%{y:,.1f}",
            resident="%{customdata[1]:,.1f}",
            where="%{customdata[0]}",
        )
        + "<extra></extra>"
    )


def _series_settings(result: SweepResult, lang: str) -> list[tuple[str, str, int | None, bool]]:
    """(kind, label, every_n_layers, offload): off, full (n=1), one partial setting (the middle one measured)
    and offload where measured or predicted."""
    ns = sorted({row.every_n_layers for row in result.rows if row.every_n_layers is not None})
    settings: list[tuple[str, str, int | None, bool]] = [("off", t("setting.short_off", lang), None, False)]
    if 1 in ns:
        settings.append(("full", t("tradeoff_fig.series_full", lang, n=1), 1, False))
    partial = [n for n in ns if n > 1]
    if partial:
        middle = partial[(len(partial) - 1) // 2]
        settings.append(("partial", t("tradeoff_fig.series_partial", lang, n=middle), middle, False))
    settings.append(("offload", t("tradeoff_fig.series_offload", lang, n=1), 1, True))
    return settings


def _doublings(start: int, stop: int) -> list[int]:
    values, value = [], start
    while value <= stop:
        values.append(value)
        value *= 2
    return values
