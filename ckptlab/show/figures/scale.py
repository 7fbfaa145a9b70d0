"""The At-scale table's figures: memory per setting against a GPU, simulated.

:func:`scale_peak_figure` stacks what the device holds at the peak of the step (parameters,
gradients, activations, temporaries) per setting, draws the GPU's memory as a line and
marks what fits; :func:`resident_figure` shows what stays resident after the forward;
:func:`scale_time_figure` puts each setting's peak against its predicted step time on the GPU (the roofline's,
labelled "predicted (roofline, GPU)"), as the Trade-offs page's Pareto chart puts measured ones.
Offload's host memory is a separate hatched bar beside the device bar, never stacked on
it: it is not GPU memory. Every title and hover says "simulated".

The words are the locale files' ``scale_figures.*`` keys, in the language passed in.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from ...explore.budget import fits
from ...explore.roofline import SettingTime
from ...explore.scale import ScaleTable, Setting
from ...results import RunResult, memory_of
from ...units import GIB, MIB
from ..i18n import number, t
from ..labels import event_label, provenance_label
from ._style import BUDGET_COLOR, CATEGORY_COLORS, GRID, HOST_PATTERN, VERDICT_COLORS, VERDICT_SYMBOLS, on_white
from .breakdown import bar_unit, drawn_parts, part_bytes
from .tradeoff import free_label_positions

# The time figure's plot area in pixels on the At-scale page at 1280x720 (the wide layout's main column less the
# sidebar and the figure's margins, rounded down), where its point labels are placed.
TIME_PLOT_PX = (720, 230)
OFF_SCALE = 4  # a budget more than this many times the tallest bar is named, not drawn (the bars would vanish)


def scale_peak_figure(
    table: ScaleTable,
    budget_bytes: int | None = None,
    budget_label: str = "",
    selected: Setting | None = None,
    lang: str = "en",
) -> go.Figure:
    """Per setting, what the GPU holds at the step's peak, stacked, against the GPU's memory.

    Args:
        table: the simulated results (a stopped table draws what it has).
        budget_bytes: the GPU's memory (a horizontal line, and each bar marked fits / does not fit).
        budget_label: the GPU's name, e.g. "H100 80 GB".
        selected: the setting shown in detail elsewhere (its label is bold).
        lang: language of the words (``ckptlab.show.i18n``).

    Returns:
        A bar figure; hover shows the exact MiB and GiB of each part and "simulated".
    """
    results = _with_memory(table)
    peaks = [memory_of(result).peak_bytes for result in results]
    hosts = [memory_of(result).host_offload_bytes for result in results]
    tallest = max(peaks + hosts, default=0)
    on_scale = budget_bytes is not None and budget_bytes <= OFF_SCALE * max(tallest, 1)
    top = max(tallest, budget_bytes if on_scale and budget_bytes is not None else 0)
    scale, unit = bar_unit(top)
    ticks = _ticks(table, results, selected, lang)
    offsets, widths = _device_slots(results)
    slots = list(range(len(results)))
    provenance = _provenance(results, lang)

    figure = go.Figure()
    base = [0] * len(results)
    for part in drawn_parts([memory_of(result).breakdown_at_peak for result in results]):
        values = [part_bytes(memory_of(result).breakdown_at_peak, part) for result in results]
        name = t(f"scale_figures.{part}", lang)  # "parameters and buffers": the buffers are folded in
        figure.add_trace(
            go.Bar(
                x=slots, y=[v / scale for v in values], base=[b / scale for b in base], offset=offsets, width=widths,
                name=name, marker={"color": CATEGORY_COLORS[part], "line": {"color": "white", "width": 0.5}},
                hovertext=[_hover(lang, tick, name, value, provenance) for tick, value in zip(ticks, values)], hoverinfo="text",
            )
        )  # fmt: skip
        base = [b + v for b, v in zip(base, values)]
    _add_host(figure, results, ticks, scale, lang, provenance)

    subtitle = t("scale_figures.peak_subtitle", lang, provenance=provenance, **_shape(table))
    if budget_bytes is not None:
        gpu = budget_label or _gib_text(budget_bytes, lang)
        for fit in (True, False):
            index = [i for i, result in enumerate(results) if fits(result, budget_bytes) == fit]
            if not index:
                continue
            verdict = t(f"scale_figures.{'fits' if fit else 'no_fit'}", lang, budget=gpu)
            figure.add_trace(
                go.Scatter(
                    x=[_centre(i, results[i]) for i in index], y=[peaks[i] / scale for i in index], mode="markers+text",
                    name=verdict, text=[number(peaks[i] / scale, ",.1f", lang) for i in index], textposition="top center",
                    textfont={"color": VERDICT_COLORS[fit], "size": 13},
                    marker={"symbol": VERDICT_SYMBOLS[fit], "size": 12, "color": VERDICT_COLORS[fit],
                            "line": {"color": "white", "width": 1}},
                    hovertext=[
                        t("scale_figures.hover_peak", lang, setting=_plain(ticks[i]), mib=peaks[i] / MIB, gib=peaks[i] / GIB, verdict=verdict,
                          where=event_label(memory_of(results[i]).peak_where, lang) or "?", provenance=provenance)
                        for i in index
                    ],
                    hoverinfo="text", cliponaxis=False,
                )
            )  # fmt: skip
        if on_scale:
            # A trace, not a shape: the legend names the line, and no label sits on a bar.
            figure.add_trace(
                go.Scatter(
                    x=[-0.6, len(results) - 0.4], y=[budget_bytes / scale] * 2, mode="lines",
                    name=t("scale_figures.budget", lang, budget=gpu, gib=budget_bytes / GIB),
                    line={"color": BUDGET_COLOR, "width": 2, "dash": "dash"}, hoverinfo="name",
                )
            )  # fmt: skip
        else:
            subtitle += t("scale_figures.budget_off_scale", lang, budget=gpu, gib=budget_bytes / GIB)
    _layout(
        figure,
        lang,
        t("scale_figures.peak_title", lang, **_shape(table)) + _per_gpu(table, lang),
        subtitle,
        t("scale_figures.x_title", lang),
        t("scale_figures.peak_y", lang, unit=unit),
        ticks,
    )
    figure.update_yaxes(range=[0, top / scale * 1.12 or 1])
    return figure


def resident_figure(table: ScaleTable, selected: Setting | None = None, lang: str = "en") -> go.Figure:
    """Per setting, the activations resident after the forward (what the backward will need).

    Above the parameters: the memory checkpointing frees. Offload's host memory is a hatched bar beside.

    Args:
        table: the simulated results.
        selected: the setting shown in detail elsewhere (its label is bold).
        lang: language of the words (``ckptlab.show.i18n``).
    """
    results = _with_memory(table)
    resident = [memory_of(result).after_forward_bytes for result in results]
    hosts = [memory_of(result).host_offload_bytes for result in results]
    scale, unit = bar_unit(max(resident + hosts, default=0))
    ticks = _ticks(table, results, selected, lang)
    offsets, widths = _device_slots(results)
    slots = list(range(len(results)))
    provenance = _provenance(results, lang)
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=slots, y=[v / scale for v in resident], offset=offsets, width=widths, name=t("scale_figures.resident", lang),
            marker={"color": CATEGORY_COLORS["activation"]}, text=[number(v / scale, ",.1f", lang) for v in resident], textposition="outside",
            hovertext=[_hover(lang, tick, t("scale_figures.resident", lang), value, provenance) for tick, value in zip(ticks, resident)],
            hoverinfo="text", cliponaxis=False,
        )
    )  # fmt: skip
    _add_host(figure, results, ticks, scale, lang, provenance, labels=True)
    title = t("scale_figures.resident_title", lang, **_shape(table)) + _per_gpu(table, lang)
    _layout(
        figure,
        lang,
        title,
        t("scale_figures.resident_subtitle", lang, provenance=provenance, **_shape(table)),
        t("scale_figures.x_title", lang),
        t("scale_figures.resident_y", lang, unit=unit),
        ticks,
    )
    figure.update_yaxes(range=[0, max(resident + hosts, default=0) / scale * 1.15 or 1])
    return figure


def scale_time_figure(
    table: ScaleTable,
    times: list[SettingTime],
    budget_bytes: int | None = None,
    budget_label: str = "",
    selected: Setting | None = None,
    lang: str = "en",
) -> go.Figure:
    """Memory against time at scale: each setting's simulated peak against its predicted step time, the budget line.

    Args:
        table: the simulated results.
        times: each result's predicted time and factor over off (``explore.scale.table_times``), in the table's
            order; a setting without a prediction (no counted work) is left out.
        budget_bytes: the GPU's memory: a horizontal line, and each point marked fits / does not fit (the one rule).
        budget_label: the GPU's name, e.g. "H100 80 GB".
        selected: the setting shown in detail elsewhere (its label is bold).
        lang: language of the words.

    Returns:
        A scatter figure; the axes, the title and every hover say which figure is simulated and which predicted.
        Settings a layer apart crowd at scale: a label with no free place is left out (its hover still names it).
    """
    points = [
        (result, time.prediction.seconds * 1000, time.factor_over_off)
        for result, time in zip(table.results, times)
        if result.memory is not None and time.prediction is not None
    ]
    provenance = _provenance([result for result, _, _ in points], lang)
    timed = next((time.prediction for time in times if time.prediction is not None), None)
    predicted = provenance_label(timed.provenance, lang) if timed is not None else ""
    peaks = [memory_of(result).peak_bytes for result, _, _ in points]
    top = max(peaks + ([budget_bytes] if budget_bytes is not None else []), default=0)
    scale, unit = bar_unit(top)
    low, high = min((ms for _, ms, _ in points), default=0.0), max((ms for _, ms, _ in points), default=1.0)
    pad = (high - low) * 0.12 or high * 0.05 or 1.0
    x_range, y_range = (low - pad, high + pad), (0.0, top / scale * 1.15 or 1.0)
    keys = [Setting.of(result.spec).key for result, _, _ in points]
    budget_y = budget_bytes / scale if budget_bytes is not None else None
    places = free_label_positions(
        [(ms, peak / scale, key) for (_, ms, _), peak, key in zip(points, peaks, keys)],
        x_range,
        y_range,
        budget_y,
        TIME_PLOT_PX,
    )
    gpu = budget_label or (_gib_text(budget_bytes, lang) if budget_bytes is not None else "")
    figure = go.Figure()
    for fit in (True, False) if budget_bytes is not None else (True,):
        index = [
            i for i, (result, _, _) in enumerate(points) if budget_bytes is None or fits(result, budget_bytes) == fit
        ]
        if not index:
            continue
        name = (
            t(f"scale_figures.{'fits' if fit else 'no_fit'}", lang, budget=gpu)
            if budget_bytes is not None
            else provenance
        )
        hovers = [
            t("scale_figures.hover_time", lang, setting=keys[i], ms=points[i][1], gib=peaks[i] / GIB,
              factor="" if points[i][2] is None else t("scale_figures.time_factor", lang, factor=points[i][2]),
              provenance=provenance, predicted=predicted)
            for i in index
        ]  # fmt: skip
        labels = [
            "" if places[i] is None else f"<b>{keys[i]}</b>" if Setting.of(points[i][0].spec) == selected else keys[i]
            for i in index
        ]
        figure.add_trace(
            go.Scatter(
                x=[points[i][1] for i in index], y=[peaks[i] / scale for i in index], mode="markers+text", name=name,
                text=labels, textposition=[places[i] or "top center" for i in index],
                textfont={"color": VERDICT_COLORS[fit], "size": 13},
                marker={"symbol": VERDICT_SYMBOLS[fit], "size": 11, "color": VERDICT_COLORS[fit],
                        "line": {"color": "white", "width": 1}},
                hovertext=hovers, hoverinfo="text", cliponaxis=False,
            )
        )  # fmt: skip
    if budget_bytes is not None:
        figure.add_trace(
            go.Scatter(
                x=list(x_range), y=[budget_y, budget_y], mode="lines",
                name=t("scale_figures.budget", lang, budget=gpu, gib=budget_bytes / GIB),
                line={"color": BUDGET_COLOR, "width": 2, "dash": "dash"}, hoverinfo="name",
            )
        )  # fmt: skip
    figure.update_layout(
        title={
            "text": t("scale_figures.time_title", lang, **_shape(table)) + _per_gpu(table, lang),
            "subtitle": {"text": t("scale_figures.time_subtitle", lang, provenance=provenance, predicted=predicted,
                                   **_shape(table))},
            "x": 0,
            "xref": "paper",
        },
        height=480,
        # Two subtitle lines above; the ticks, the axis title, then the legend below, clear of each other.
        margin={"l": 60, "r": 20, "t": 115, "b": 130},
        legend={"orientation": "h", "yanchor": "top", "y": -0.32, "x": 0},
        **on_white(13, lang),
        hoverlabel={"font": {"size": 14}},
    )  # fmt: skip
    figure.update_xaxes(
        title_text=t("scale_figures.time_x", lang, predicted=predicted), gridcolor=GRID, range=list(x_range)
    )
    figure.update_yaxes(title_text=t("scale_figures.peak_y", lang, unit=unit), gridcolor=GRID, range=list(y_range))
    return figure


# -- helpers ----------------------------------------------------------------------------------


def _with_memory(table: ScaleTable) -> list[RunResult]:
    return [result for result in table.results if result.memory is not None]


def _shape(table: ScaleTable) -> dict[str, Any]:
    request = table.request
    return {
        "model": request.model,
        "seq_len": request.seq_len,
        "batch_size": request.batch_size,
        "dtype": request.dtype,
    }


def _per_gpu(table: ScaleTable, lang: str) -> str:
    """Past one GPU the figures are rank 0's: the title says so."""
    gpus = table.request.world_size
    return t("scale_figures.per_gpu", lang, gpus=gpus) if gpus > 1 else ""


def _provenance(results: list[RunResult], lang: str) -> str:
    return provenance_label(results[0].provenance, lang) if results else t("fig.seen_simulated", lang)


def _gib_text(num_bytes: int, lang: str) -> str:
    return f"{number(num_bytes / GIB, ',.1f', lang)} GiB"


def _ticks(table: ScaleTable, results: list[RunResult], selected: Setting | None, lang: str) -> list[str]:
    ticks = []
    for result in results:
        setting = Setting.of(result.spec)
        tick = t("scale_figures.tick", lang, setting=setting.key, cp=setting.cp_layers(table.num_layers))
        ticks.append(f"<b>{tick}</b>" if setting == selected else tick)
    return ticks


def _plain(tick: str) -> str:
    return tick.replace("<b>", "").replace("</b>", "").split("<br>")[0]


def _centre(slot: int, result: RunResult) -> float:
    """The middle of a setting's device bar."""
    return slot - 0.22 if result.spec.offload else slot


def _device_slots(results: list[RunResult]) -> tuple[list[float], list[float]]:
    """Bar offset and width per setting: offload settings share their slot with the host bar."""
    offsets = [-0.42 if result.spec.offload else -0.3 for result in results]
    widths = [0.4 if result.spec.offload else 0.6 for result in results]
    return offsets, widths


def _add_host(
    figure: go.Figure,
    results: list[RunResult],
    ticks: list[str],
    scale: int,
    lang: str,
    provenance: str,
    labels: bool = False,
) -> None:
    index = [i for i, result in enumerate(results) if result.spec.offload]
    if not index:
        return
    values = [memory_of(results[i]).host_offload_bytes for i in index]
    figure.add_trace(
        go.Bar(
            x=index, y=[v / scale for v in values], offset=0.02, width=0.4, name=t("scale_figures.host", lang),
            marker={"color": CATEGORY_COLORS["host"], "pattern": HOST_PATTERN, "line": {"color": CATEGORY_COLORS["host"], "width": 1}},
            text=[number(v / scale, ",.1f", lang) for v in values] if labels else None, textposition="outside",
            hovertext=[_hover(lang, ticks[i], t("scale_figures.host", lang), v, provenance) for i, v in zip(index, values)],
            hoverinfo="text", cliponaxis=False,
        )
    )  # fmt: skip


def _hover(lang: str, tick: str, part: str, value: int, provenance: str) -> str:
    return t(
        "scale_figures.hover",
        lang,
        setting=_plain(tick),
        part=part,
        mib=value / MIB,
        gib=value / GIB,
        provenance=provenance,
    )


def _layout(
    figure: go.Figure, lang: str, title: str, subtitle: str, x_title: str, y_title: str, ticks: list[str]
) -> None:
    figure.update_layout(
        title={"text": title, "subtitle": {"text": subtitle}, "x": 0, "xref": "paper"},
        barmode="overlay",  # slots and stacking are placed by hand (offset, width, base)
        height=500,
        # A two-line subtitle; two-line ticks, the axis title, then the legend, clear of a long axis title (pt-BR's
        # "configuração (camadas com checkpoint)" met the legend at 1280x720).
        margin={"l": 60, "r": 20, "t": 115, "b": 150},
        legend={"orientation": "h", "yanchor": "top", "y": -0.31, "x": 0},
        **on_white(13, lang),
        hoverlabel={"font": {"size": 14}},
    )
    figure.update_yaxes(gridcolor=GRID, title_text=y_title)
    # Numbered slots, not categories: a marker can then sit over the device half of an offload slot.
    figure.update_xaxes(
        title_text=x_title,
        tickvals=list(range(len(ticks))),
        ticktext=ticks,
        range=[-0.6, len(ticks) - 0.4],
        showgrid=False,
    )
