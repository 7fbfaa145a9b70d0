"""Why nvidia-smi shows more than your tensors: a step's allocated bytes inside its reserved bytes, event by event.

The caching allocator replayed over a simulated step's order of allocations (``ckptlab.explore.device``:
:class:`~ckptlab.explore.device.SegmentsOverTime`): the reserved bytes under torch's defaults as a grey area, the
allocated bytes (what the live tensors' blocks hold) as a line inside it, and the same step's reserved bytes with
``expandable_segments:True`` as a dashed line. Reserved is never below allocated; the gap is the allocator's cache.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ...explore.device import SegmentsOverTime
from ...units import MIB
from ..i18n import t
from ._style import CATEGORY_COLORS, GREY, GRID, RUN_COLOR, heading, legend, on_white


def segments_figure(
    default: SegmentsOverTime, expandable: SegmentsOverTime, subtitle: str, lang: str = "en", height: int = 430
) -> go.Figure:
    """The step's reserved bytes (torch's defaults: a filled area; expandable segments: a dashed line) and its
    allocated bytes (a line), over the step's events, in MiB.

    Args:
        default: the step replayed under torch's defaults (or the spec's setting).
        expandable: the same order replayed with ``expandable_segments:True``.
        subtitle: the shape and the provenance, in words.
        lang: language of the words.
        height: pixels.
    """
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=list(default.events),
            y=[size / MIB for size in default.reserved],
            name=t("allocator_fig.reserved", lang),
            mode="lines",
            line={"color": GREY, "shape": "hv"},
            fill="tozeroy",
        )
    )
    figure.add_trace(
        go.Scatter(
            x=list(default.events),
            y=[size / MIB for size in default.allocated],
            name=t("allocator_fig.allocated", lang),
            mode="lines",
            line={"color": CATEGORY_COLORS["activation_and_temp"], "shape": "hv"},
        )
    )
    figure.add_trace(
        go.Scatter(
            x=list(expandable.events),
            y=[size / MIB for size in expandable.reserved],
            name=t("allocator_fig.reserved_expandable", lang),
            mode="lines",
            line={"color": RUN_COLOR, "dash": "dash", "shape": "hv"},
        )
    )
    figure.update_layout(
        title=heading(t("allocator_fig.title", lang), subtitle),
        height=height,
        margin={"l": 60, "r": 20, "t": 90, "b": 40},
        legend=legend(-0.2),
        **on_white(13, lang),
    )
    figure.update_yaxes(gridcolor=GRID, title_text=t("allocator_fig.y", lang), rangemode="tozero")
    figure.update_xaxes(showgrid=False, title_text=t("allocator_fig.x", lang, events=default.events_total))
    return figure
