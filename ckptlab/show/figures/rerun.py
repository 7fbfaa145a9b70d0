"""The rerun against the textbook's one extra forward: per model and length, the rerun's time as a share of the
forward's, split into the attention kernels and the rest of the layers, beside the head and the loss it never runs.

The textbook says checkpointing every layer costs one extra forward (x4/3 of a step whose backward is two
forwards). The bars say why a predicted step differs: the rerun is the layers' forward only (the lm head and the
loss are not rerun, so it is less than a forward), the attention's share of it grows with the sequence, and a small
model's kernels are bound by launches. Every figure here is predicted by the roofline over simulated steps, and the
title says so. Words: ``rerun_fig.*``.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from ...explore.roofline import TEXTBOOK_FACTOR, RerunAnatomy
from ..i18n import number, t
from ._style import BUDGET_COLOR, CATEGORY_COLORS, GRID, HOST_PATTERN, LIGHT_GREY, heading, legend, on_white


def rerun_figure(cases: Sequence[tuple[str, RerunAnatomy]], subtitle: str, lang: str = "en") -> go.Figure:
    """Per case (its label, e.g. "qwen3-8b · 8,192"), the rerun's time over the forward's, stacked: attention, the
    layers' other ops; above them what the forward runs and the rerun does not (each layer's last matmul, then the head
    and the loss, hatched), up to the whole forward (1.0, the textbook's rerun).

    Args:
        cases: ``(label, anatomy)`` per model and length.
        subtitle: the device and the provenance, in words.
        lang: language of the words.
    """
    labels = [label for label, _ in cases]
    attention = [anatomy.attention_share * anatomy.rerun_of_forward for _, anatomy in cases]
    rest = [anatomy.rerun_of_forward - share for share, (_, anatomy) in zip(attention, cases)]
    head = [anatomy.head_share for _, anatomy in cases]
    skipped = [anatomy.skipped_share for _, anatomy in cases]
    factors = [t("rerun_fig.factor", lang, factor=anatomy.factor, textbook=TEXTBOOK_FACTOR) for _, anatomy in cases]
    figure = go.Figure()
    for name, values, style in (
        (t("rerun_fig.attention", lang), attention, {"color": CATEGORY_COLORS["activation"]}),
        (t("rerun_fig.rest", lang), rest, {"color": CATEGORY_COLORS["parameter"]}),
        (t("rerun_fig.skipped", lang), skipped, {"color": LIGHT_GREY}),
        (t("rerun_fig.head", lang), head, {"color": LIGHT_GREY, "pattern": HOST_PATTERN}),
    ):
        figure.add_trace(
            go.Bar(
                x=labels,
                y=values,
                name=name,
                marker=style,
                hovertext=[
                    t("rerun_fig.hover", lang, case=label, part=name, share=value * 100, factor=factor)
                    for label, value, factor in zip(labels, values, factors)
                ],
                hoverinfo="text",
            )
        )
    figure.add_trace(  # the factors over the bars: the step's predicted cost of checkpointing every layer
        go.Scatter(
            x=labels,
            y=[1.12] * len(cases),  # above the whole forward's line, clear of the bars
            mode="text",
            text=[number(anatomy.factor, ",.2f", lang).join(("×", "")) for _, anatomy in cases],
            textposition="top center",
            showlegend=False,
            hoverinfo="skip",
            cliponaxis=False,
        )
    )
    figure.add_hline(y=1.0, line={"color": BUDGET_COLOR, "width": 2, "dash": "dash"})
    figure.update_layout(
        title=heading(t("rerun_fig.title", lang), subtitle),
        barmode="stack",
        height=460,
        margin={"l": 60, "r": 20, "t": 90, "b": 40},
        legend=legend(-0.2),
        **on_white(13, lang),
        hoverlabel={"font": {"size": 14}},
    )
    figure.update_yaxes(gridcolor=GRID, title_text=t("rerun_fig.y", lang), range=[0, 1.22], tickformat=".0%")
    figure.update_xaxes(showgrid=False)
    return figure
