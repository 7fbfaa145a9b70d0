"""Pure Plotly builders for the At-scale table: memory per setting against a GPU, simulated.

:func:`peak_figure` stacks what the device holds at the peak of the step (parameters,
gradients, activations, temporaries) per setting, draws the GPU's memory as a line and
marks what fits; :func:`resident_figure` shows what stays resident after the forward.
Offload's host memory is a separate hatched bar beside the device bar, never stacked on
it: it is not GPU memory. Every title and hover says "simulated".

The words are in :data:`WORDS` (override any of them with ``words=`` for a translation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from ..explore.scale import ScaleTable, Setting, fits
from ..results import RunResult, memory_of
from ..units import GIB, MIB

FONT = "Arial, Helvetica, sans-serif"

WORDS: dict[str, str] = {
    "peak_title": "Memory at the peak of the step, simulated: {model}, seq {seq_len:,}",
    "resident_title": "Resident after the forward, simulated: {model}, seq {seq_len:,}",
    "peak_subtitle": "batch {batch_size} · {dtype} · {provenance}<br>bars: GPU memory at the step's peak · hatched: host memory (offload), not GPU",
    "resident_subtitle": "batch {batch_size} · {dtype} · {provenance}<br>activations kept for the backward, above the parameters · hatched: host memory (offload)",
    "x_title": "setting (checkpointed layers)",
    "peak_y": "simulated GPU memory, {unit}",
    "resident_y": "simulated memory, {unit}",
    "parameter": "parameters and buffers",
    "gradient": "gradients",
    "optimizer_state": "optimizer state",
    "activation": "activations",
    "temp": "temporaries",
    "activation_and_temp": "activations and temporaries",
    "other": "other",
    "resident": "activations resident after the forward",
    "host": "host memory (offload), not GPU",
    "fits": "fits in {budget}",
    "no_fit": "does not fit in {budget}",
    "budget": "{budget}: {gib:,.1f} GiB",
    "budget_off_scale": "<br>{budget} ({gib:,.0f} GiB) is far above every bar: everything fits",
    "tick": "{setting}<br>{cp} CP",
    "hover": "<b>{setting}</b><br>{part}: {mib:,.1f} MiB ({gib:,.2f} GiB)<br>{provenance}",
    "per_gpu": ", one GPU: rank 0 of {gpus} (FSDP2)",
    "hover_peak": "<b>{setting}</b>: peak {mib:,.1f} MiB ({gib:,.2f} GiB), {verdict}<br>reached in: {where}<br>{provenance}",
}

# Okabe-Ito: told apart by colour-blind readers and on a washed-out projector.
COLORS = {
    "parameter": "#0072B2",
    "gradient": "#56B4E9",
    "optimizer_state": "#009E73",
    "activation": "#D55E00",
    "temp": "#E69F00",
    "activation_and_temp": "#D55E00",
    "other": "#000000",
    "host": "#CC79A7",
    "fits": "#009E73",
    "no_fit": "#000000",  # not vermillion: that is the activations' colour
    "budget": "#000000",
}
# Streamlit's plotly.js draws nothing for a pattern with an rgba fgcolor: hex colours only.
HOST_PATTERN = {"shape": "/", "bgcolor": "#F5E1EC", "fgcolor": "#CC79A7", "size": 8, "solidity": 0.45}
PARTS = ("parameter", "gradient", "optimizer_state", "activation", "temp", "activation_and_temp")  # bottom to top
FOLDED = {"buffer": "parameter"}  # a few KiB of rotary tables: a segment of their own would only crowd the legend
OFF_SCALE = 4  # a budget more than this many times the tallest bar is named, not drawn (the bars would vanish)


def peak_figure(
    table: ScaleTable,
    budget_bytes: int | None = None,
    budget_label: str = "",
    selected: Setting | None = None,
    words: Mapping[str, str] | None = None,
) -> go.Figure:
    """Per setting, what the GPU holds at the step's peak, stacked, against the GPU's memory.

    Args:
        table: the simulated results (a stopped table draws what it has).
        budget_bytes: the GPU's memory (a horizontal line, and each bar marked fits / does not fit).
        budget_label: the GPU's name, e.g. "H100 80 GB".
        selected: the setting shown in detail elsewhere (its label is bold).
        words: replacements for :data:`WORDS`.

    Returns:
        A bar figure; hover shows the exact MiB and GiB of each part and "simulated".
    """
    say = {**WORDS, **(words or {})}
    results = _with_memory(table)
    peaks = [memory_of(result).peak_bytes for result in results]
    hosts = [memory_of(result).host_offload_bytes for result in results]
    tallest = max(peaks + hosts, default=0)
    draw_budget = budget_bytes is not None and budget_bytes <= OFF_SCALE * max(tallest, 1)
    scale, unit = _unit(max(tallest, budget_bytes if draw_budget and budget_bytes is not None else 0))
    ticks = _ticks(table, results, selected, say)
    offsets, widths = _device_slots(results)
    slots = list(range(len(results)))
    provenance = _provenance(results)

    figure = go.Figure()
    parts = [part for part in PARTS if any(part_bytes(memory_of(r).breakdown_at_peak, part) for r in results)]
    if any(set(memory_of(r).breakdown_at_peak) - set(PARTS) - set(FOLDED) for r in results):
        parts.append("other")
    base = [0] * len(results)
    for part in parts:
        values = [part_bytes(memory_of(result).breakdown_at_peak, part) for result in results]
        figure.add_trace(
            go.Bar(
                x=slots, y=[v / scale for v in values], base=[b / scale for b in base], offset=offsets, width=widths,
                name=say[part], marker={"color": COLORS[part], "line": {"color": "white", "width": 0.5}},
                hovertext=[_hover(say, tick, say[part], value, provenance) for tick, value in zip(ticks, values)], hoverinfo="text",
            )
        )  # fmt: skip
        base = [b + v for b, v in zip(base, values)]
    _add_host(figure, results, ticks, scale, say, provenance)

    if budget_bytes is not None:
        for fit in (True, False):
            index = [i for i, result in enumerate(results) if fits(result, budget_bytes) == fit]
            if not index:
                continue
            verdict = say["fits" if fit else "no_fit"].format(budget=budget_label or _gib_text(budget_bytes))
            figure.add_trace(
                go.Scatter(
                    x=[_centre(i, results[i]) for i in index], y=[peaks[i] / scale for i in index], mode="markers+text",
                    name=verdict, text=[f"{peaks[i] / scale:,.1f}" for i in index], textposition="top center",
                    textfont={"color": COLORS["fits" if fit else "no_fit"], "size": 13},
                    marker={"symbol": "circle" if fit else "x", "size": 12, "color": COLORS["fits" if fit else "no_fit"],
                            "line": {"color": "white", "width": 1}},
                    hovertext=[
                        say["hover_peak"].format(setting=_plain(ticks[i]), mib=peaks[i] / MIB, gib=peaks[i] / GIB, verdict=verdict,
                                                 where=memory_of(results[i]).peak_where.description or "?", provenance=provenance)
                        for i in index
                    ],
                    hoverinfo="text", cliponaxis=False,
                )
            )  # fmt: skip
    subtitle = say["peak_subtitle"].format(provenance=provenance, **_shape(table))
    if budget_bytes is not None and draw_budget:
        # A trace, not a shape: the legend names the line, and no label sits on a bar.
        name = say["budget"].format(budget=budget_label or _gib_text(budget_bytes), gib=budget_bytes / GIB)
        figure.add_trace(
            go.Scatter(
                x=[-0.6, len(results) - 0.4], y=[budget_bytes / scale] * 2, mode="lines", name=name,
                line={"color": COLORS["budget"], "width": 2, "dash": "dash"}, hoverinfo="name",
            )
        )  # fmt: skip
    elif budget_bytes is not None:
        subtitle += say["budget_off_scale"].format(
            budget=budget_label or _gib_text(budget_bytes), gib=budget_bytes / GIB
        )
    _layout(
        figure,
        say["peak_title"].format(**_shape(table)) + _per_gpu(table, say),
        subtitle,
        say["x_title"],
        say["peak_y"].format(unit=unit),
        ticks,
    )
    top = max(max(peaks + hosts, default=0), budget_bytes if draw_budget and budget_bytes is not None else 0) / scale
    figure.update_yaxes(range=[0, top * 1.12 or 1])
    return figure


def resident_figure(
    table: ScaleTable, selected: Setting | None = None, words: Mapping[str, str] | None = None
) -> go.Figure:
    """Per setting, the activations resident after the forward (what the backward will need).

    Above the parameters: the memory checkpointing frees. Offload's host memory is a hatched bar beside.

    Args:
        table: the simulated results.
        selected: the setting shown in detail elsewhere (its label is bold).
        words: replacements for :data:`WORDS`.
    """
    say = {**WORDS, **(words or {})}
    results = _with_memory(table)
    resident = [memory_of(result).after_forward_bytes for result in results]
    hosts = [memory_of(result).host_offload_bytes for result in results]
    scale, unit = _unit(max(resident + hosts, default=0))
    ticks = _ticks(table, results, selected, say)
    offsets, widths = _device_slots(results)
    slots = list(range(len(results)))
    provenance = _provenance(results)
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=slots, y=[v / scale for v in resident], offset=offsets, width=widths, name=say["resident"],
            marker={"color": COLORS["activation"]}, text=[f"{v / scale:,.1f}" for v in resident], textposition="outside",
            hovertext=[_hover(say, tick, say["resident"], value, provenance) for tick, value in zip(ticks, resident)],
            hoverinfo="text", cliponaxis=False,
        )
    )  # fmt: skip
    _add_host(figure, results, ticks, scale, say, provenance, labels=True)
    title = say["resident_title"].format(**_shape(table)) + _per_gpu(table, say)
    _layout(
        figure,
        title,
        say["resident_subtitle"].format(provenance=provenance, **_shape(table)),
        say["x_title"],
        say["resident_y"].format(unit=unit),
        ticks,
    )
    figure.update_yaxes(range=[0, max(resident + hosts, default=0) / scale * 1.15 or 1])
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


def _per_gpu(table: ScaleTable, say: Mapping[str, str]) -> str:
    """Past one GPU the figures are rank 0's: the title says so."""
    gpus = table.request.world_size
    return say["per_gpu"].format(gpus=gpus) if gpus > 1 else ""


def _provenance(results: list[RunResult]) -> str:
    return results[0].provenance.label if results else "simulated"


def _unit(top_bytes: float) -> tuple[int, str]:
    # Real shapes are tens of GiB; tiny presets a few MiB, which GiB would draw as 0.0.
    return (GIB, "GiB") if top_bytes >= GIB else (MIB, "MiB")


def _gib_text(num_bytes: int) -> str:
    return f"{num_bytes / GIB:,.1f} GiB"


def part_bytes(breakdown: Mapping[str, int], part: str) -> int:
    """Bytes of one drawn segment: a category of :data:`PARTS` with what :data:`FOLDED` puts into it, or "other"."""
    if part == "other":
        return sum(value for key, value in breakdown.items() if key not in PARTS and key not in FOLDED)
    return breakdown.get(part, 0) + sum(breakdown.get(key, 0) for key, into in FOLDED.items() if into == part)


def _ticks(table: ScaleTable, results: list[RunResult], selected: Setting | None, say: Mapping[str, str]) -> list[str]:
    ticks = []
    for result in results:
        setting = Setting.of(result.spec)
        tick = say["tick"].format(setting=setting.key, cp=setting.cp_layers(table.num_layers))
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
    say: Mapping[str, str],
    provenance: str,
    labels: bool = False,
) -> None:
    index = [i for i, result in enumerate(results) if result.spec.offload]
    if not index:
        return
    values = [memory_of(results[i]).host_offload_bytes for i in index]
    figure.add_trace(
        go.Bar(
            x=index, y=[v / scale for v in values], offset=0.02, width=0.4, name=say["host"],
            marker={"color": COLORS["host"], "pattern": HOST_PATTERN, "line": {"color": COLORS["host"], "width": 1}},
            text=[f"{v / scale:,.1f}" for v in values] if labels else None, textposition="outside",
            hovertext=[_hover(say, ticks[i], say["host"], v, provenance) for i, v in zip(index, values)],
            hoverinfo="text", cliponaxis=False,
        )
    )  # fmt: skip


def _hover(say: Mapping[str, str], tick: str, part: str, value: int, provenance: str) -> str:
    return say["hover"].format(setting=_plain(tick), part=part, mib=value / MIB, gib=value / GIB, provenance=provenance)


def _layout(figure: go.Figure, title: str, subtitle: str, x_title: str, y_title: str, ticks: list[str]) -> None:
    figure.update_layout(
        title={"text": title, "subtitle": {"text": subtitle}, "x": 0, "xref": "paper"},
        barmode="overlay",  # slots and stacking are placed by hand (offset, width, base)
        height=480,
        margin={"l": 60, "r": 20, "t": 115, "b": 130},  # a two-line subtitle; two-line ticks, then the legend
        legend={"orientation": "h", "yanchor": "top", "y": -0.25, "x": 0},
        font={"family": FONT, "size": 13},
        hoverlabel={"font": {"size": 14}},
        plot_bgcolor="white",
    )
    figure.update_yaxes(gridcolor="#e5e5e5", title_text=y_title)
    # Numbered slots, not categories: a marker can then sit over the device half of an offload slot.
    figure.update_xaxes(
        title_text=x_title,
        tickvals=list(range(len(ticks))),
        ticktext=ticks,
        range=[-0.6, len(ticks) - 0.4],
        showgrid=False,
    )
