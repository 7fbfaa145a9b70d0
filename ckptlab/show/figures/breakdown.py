"""Where the memory goes: the memory at a step's peak, by category, run beside run; and one GPU's parts under sharding.

One stacked bar per run: parameters (buffers folded in), gradients, optimizer state,
activations and temporaries, bottom to top (:data:`PARTS`, which the At-scale figures
stack too), in the lab's one palette of categories. On CUDA
the allocator cannot split activations from temporaries: one ``activation_and_temp``
segment. The subtitle says where the numbers come from; each tick says where the peak sat
(in the optimizer step of a full fine-tune, activations are gone and checkpointing has
nothing to shrink).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import plotly.graph_objects as go

from ...results import MemoryResult, RunResult
from ...units import GIB, MIB
from ..i18n import number, t
from ..labels import provenance_label, training_label
from ._style import CATEGORY_COLORS, GRID, column_px, heading, legend, on_white, wrapped

PARTS = ("parameter", "gradient", "optimizer_state", "activation", "temp", "activation_and_temp")  # bottom to top
FOLDED = {"buffer": "parameter"}  # a few KiB of rotary tables: a segment of their own would only crowd the legend
TICK_CHAR_PX = 7.5  # a Latin character of a 13 px tick label, on average (a CJK one counts two)
PLOT_MARGIN_PX = 80  # the figure's width less its plot's: the y axis's title and ticks, the right margin
LABEL_CHARS = 20  # a bar's label on a line at most: longer reads as a sentence


def tick_width(bars: int, width: int = column_px(0.6)) -> int:
    """The characters of one bar's tick label on a line (a wide CJK character counts two) in a figure ``width``
    pixels wide: its bar's share of the plot, :data:`LABEL_CHARS` at most and 8 at least (a word)."""
    return max(8, min(LABEL_CHARS, int((width - PLOT_MARGIN_PX) / max(bars, 1) / TICK_CHAR_PX)))


def wrapped_ticks(labels: Sequence[str], width: int = column_px(0.6)) -> tuple[list[str], int]:
    """``labels`` wrapped to :func:`tick_width`, and how many lines the longest took (for the bottom margin)."""
    ticks = [wrapped(label, tick_width(len(labels), width)) for label in labels]
    return ticks, max((tick.count("<br>") + 1 for tick in ticks), default=1)


def above_baseline_after_forward(memory: MemoryResult) -> dict[str, int]:
    """What a step holds at the end of the forward beyond what it held before it, by category (parameters and
    buffers cancel out): the activations the backward will read. Sums to ``memory.after_forward_bytes``."""
    before = memory.breakdown_baseline
    return {key: value - before.get(key, 0) for key, value in memory.breakdown_after_forward.items()}


def bar_unit(top_bytes: float) -> tuple[int, str]:
    """The unit to draw bars up to ``top_bytes`` in: GiB for real shapes (tens of GiB), MiB for tiny presets
    (a few MiB, which GiB would draw as 0.0)."""
    return (GIB, "GiB") if top_bytes >= GIB else (MIB, "MiB")


def part_bytes(breakdown: Mapping[str, int], part: str) -> int:
    """Bytes of one drawn segment: a category of :data:`PARTS` with what :data:`FOLDED` puts into it, or "other"."""
    if part == "other":
        return sum(value for key, value in breakdown.items() if key not in PARTS and key not in FOLDED)
    return breakdown.get(part, 0) + sum(breakdown.get(key, 0) for key, into in FOLDED.items() if into == part)


def drawn_parts(breakdowns: Sequence[Mapping[str, int]]) -> list[str]:
    """The segments to draw, bottom to top: the :data:`PARTS` some bar holds, then "other" if a bar holds more."""
    parts = [part for part in PARTS if any(part_bytes(breakdown, part) for breakdown in breakdowns)]
    return parts + (["other"] if any(set(each) - set(PARTS) - set(FOLDED) for each in breakdowns) else [])


def breakdown_figure(
    bars: Sequence[tuple[str, RunResult]],
    lang: str = "en",
    height: int = 430,
    at: Literal["peak", "after_forward"] = "peak",
    width: int = column_px(0.6),
) -> go.Figure:
    """The memory at the peak of each run's step (or at the end of its forward), stacked by category, one bar per run.

    Args:
        bars: ``(label, result)`` in the order to draw, e.g. checkpointing off, then this run.
            Results without memory (a run that did not fit) are left out.
        lang: language of the words (``ckptlab.show.i18n``).
        height: pixels.
        at: "peak", the whole memory at the step's peak; "after_forward", what the forward left held beyond the
            memory before it (:func:`above_baseline_after_forward`): where a difference the backward frees before
            the peak shows (eager attention's probabilities at a short sequence).
        width: pixels the page draws the figure in: each bar's label wraps to its bar's share of it, horizontal
            (plotly turns a label wider than its bar sideways, where the figure's edge cut it: "checkpoin").

    Returns:
        A bar figure; the total sits above each bar, hover gives each part in MiB and its provenance.
    """
    drawn = [(label, run, run.memory) for label, run in bars if run.memory is not None and run.memory.breakdown_at_peak]
    runs = [run for _, run, _ in drawn]
    after = at == "after_forward"
    peaks = [above_baseline_after_forward(memory) if after else memory.breakdown_at_peak for _, _, memory in drawn]
    totals = [sum(peak.values()) for peak in peaks]
    scale, unit = bar_unit(max(totals, default=0))
    provenance = " / ".join(dict.fromkeys(provenance_label(run.provenance, lang) for run in runs))
    # Wrapped to each bar's share of the width, and kept horizontal (tickangle 0 below): a longer label
    # ("checkpointing desligado") runs into its neighbour's, or plotly turns it sideways and the figure's edge cuts it.
    ticks, lines = wrapped_ticks(
        [
            label
            if after
            else t("breakdown.tick", lang, label=label, phase=t(f"band.{memory.peak_where.phase or 'backward'}", lang))
            for label, _, memory in drawn
        ],
        width,
    )
    extra_lines = max(lines - 2, 0)  # the margin below holds two lines of labels; one more line for each beyond
    figure = go.Figure()
    for part in drawn_parts(peaks):
        values = [part_bytes(peak, part) for peak in peaks]
        name = t(f"category.{part}", lang)
        figure.add_trace(
            go.Bar(
                x=ticks,
                y=[value / scale for value in values],
                name=name,
                marker={"color": CATEGORY_COLORS[part], "line": {"color": "white", "width": 0.5}},
                hovertext=[
                    t("breakdown.hover", lang, bar=label, part=name, mib=value / MIB, provenance=provenance)
                    for (label, _, _), value in zip(drawn, values)
                ],
                hoverinfo="text",
            )
        )
    figure.add_trace(
        go.Scatter(
            x=ticks,
            y=[total / scale for total in totals],
            mode="text",
            text=[f"{number(total / scale, ',.1f', lang)} {unit}" for total in totals],
            textposition="top center",
            textfont={"size": 14},
            showlegend=False,
            hoverinfo="skip",
            cliponaxis=False,
        )
    )
    # What all bars share goes in the subtitle; what differs is the caller's to put in the labels.
    shared = list(dict.fromkeys(training_label(run.spec, lang) for run in runs))
    pieces = (
        [t("breakdown.subtitle", lang, model=runs[0].spec.model, seq=number(runs[0].spec.seq_len, ",", lang))]
        if runs
        else []
    )
    # The provenance on a line of its own: beside a diagram the figure is narrow, and it must not be cut off.
    subtitle = " · ".join([*pieces, *(shared if len(shared) == 1 else [])]) + f"<br>{provenance}"
    title = heading(t("breakdown.title_after_forward" if after else "breakdown.title", lang), subtitle, width_px=width)
    # A long CPU name wraps the provenance onto a third line ("measured on the CPU (Intel(R) Xeon(R) Processor, 2
    # cores)" at 1280x720): the top margin grows a line's height for each, or the subtitle runs into the axis title.
    # The figure grows by as much, so the plot and the legend under it keep their places.
    more_top = 18 * max(0, title["subtitle"]["text"].count("<br>") + 1 - 2)
    figure.update_layout(
        title=title,
        barmode="stack",
        height=height + 30 * extra_lines + more_top,
        margin={"l": 60, "r": 20, "t": 105 + more_top, "b": 40 + 30 * extra_lines},  # a title and a 2-line subtitle
        legend=legend(-0.22 - 0.12 * extra_lines, traceorder="reversed"),  # under the labels, however many lines
        **on_white(13, lang),
        hoverlabel={"font": {"size": 14}},
    )
    figure.update_yaxes(
        gridcolor=GRID,
        title_text=t("breakdown.y_after_forward" if after else "breakdown.y", lang, unit=unit),
        range=[0, max(totals, default=0) / scale * 1.15 or 1],
    )
    figure.update_xaxes(showgrid=False, tickangle=0)  # wrapped to fit: never turned sideways
    return figure


SHARDING_PARTS = ("parameter", "gradient", "optimizer_state", "activation")


def sharding_figure(
    bars: Sequence[tuple[str, Mapping[str, int]]], subtitle: str, lang: str = "en", height: int = 460
) -> go.Figure:
    """One GPU's memory by part, side by side (not stacked: each part is its own measure), per configuration.

    Args:
        bars: ``(label, parts)`` per configuration, e.g. "2 GPUs · off" and its bytes by
            :data:`SHARDING_PARTS` (``ckptlab.lab.learn.per_gpu_parts`` says what each part counts).
        subtitle: the shape and the provenance, in words.
        lang: language of the words.
        height: pixels.

    Returns:
        A grouped bar figure in the lab's category colours; hover gives MiB.
    """
    labels, lines = wrapped_ticks([label for label, _ in bars])  # horizontal, as breakdown_figure's
    top = max((value for _, parts in bars for value in parts.values()), default=0)
    scale, unit = bar_unit(top)
    figure = go.Figure()
    for part in SHARDING_PARTS:
        name = t(f"category.{part}", lang)
        values = [parts.get(part, 0) for _, parts in bars]
        figure.add_trace(
            go.Bar(
                x=labels,
                y=[value / scale for value in values],
                name=name,
                marker={"color": CATEGORY_COLORS[part]},
                hovertext=[
                    t("breakdown.hover", lang, bar=label, part=name, mib=value / MIB, provenance=subtitle)
                    for label, value in zip(labels, values)
                ],
                hoverinfo="text",
            )
        )
    figure.update_layout(
        title=heading(t("sharding_fig.title", lang), subtitle),
        barmode="group",
        height=height + 18 * (lines - 1),
        margin={"l": 60, "r": 20, "t": 90, "b": 40 + 18 * (lines - 1)},  # a line of labels more, 18 px more
        legend=legend(-0.2 - 0.08 * (lines - 1)),
        **on_white(13, lang),
        hoverlabel={"font": {"size": 14}},
    )
    figure.update_yaxes(gridcolor=GRID, title_text=t("sharding_fig.y", lang, unit=unit))
    figure.update_xaxes(showgrid=False, tickangle=0)
    return figure
