"""Pure Plotly builders: a result (or a plan) in, a figure out.

The diagram follows the text diagram of show/report.py (the README's sample output): a forward row saying what each layer keeps
(CP or keep) and a backward row saying what the backward does there (rerun or keep),
layers in order from left to right, wrapped every :data:`LAYERS_PER_LINE` layers so that
a 36-layer model stays legible on a projector. Boxes are bars (so they scale with the
figure, carry hover text and make a legend), with the role written inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..model.plan import planned_roles
from ..results import LayerResult, RunResult
from ..units import MIB
from .i18n import t

LAYERS_PER_LINE = 12

# Okabe-Ito colours: distinct for colour-blind readers and on a washed-out projector.
COLORS = {"CP": "#D55E00", "rerun": "#E69F00", "keep": "#0072B2"}
OFF_COLOR = "#0072B2"  # checkpointing off: every layer keeps, so the keep colour
RUN_COLOR = "#D55E00"
LEGEND = {
    "CP": "CP: keeps only its input",
    "keep": "keep: holds its activations, no rerun",
    "rerun": "rerun: forward runs again in the backward",
}
PLANNED_PATTERN = "/"  # planned rows are hatched so they never pass for observed ones
# Streamlit's plotly.js (4.x) draws nothing for a pattern with an rgba fgcolor: hex colours only.
HATCH = {"CP": "#E69766", "rerun": "#EDBD59", "keep": "#4095C5"}  # each colour a quarter of the way to white
FONT = "Arial, Helvetica, sans-serif"


@dataclass(frozen=True)
class _Row:
    label: str  # y-axis words, e.g. "Forward →"
    roles: Sequence[str]  # "CP" / "keep" / "rerun", one per layer in model order
    hover: Sequence[str]  # one per layer
    planned: bool  # hatched, legend says "(planned)"
    extra: Sequence[str] = ()  # a short line under the role in a box, one per layer ("" for none)


def diagram_figure(result: RunResult, lang: str = "en") -> go.Figure:
    """The step a run observed: forward row from the flags, backward row from the reruns.

    When the observed pattern differs from the every_n_layers rule, the planned rows are
    added below (hatched) and the title says so. A run that did not fit has no layers;
    its planned pattern is drawn instead, titled as such.

    Args:
        result: a :class:`~ckptlab.RunResult`.
        lang: language of the words on the figure (``ckptlab.show.i18n``).

    Returns:
        A Plotly figure; hover on a box shows what was measured for that layer.
    """
    spec = result.spec
    setting = _setting(spec.every_n_layers, result.memory.offload_applied if result.memory else False, lang)
    if not result.layers:
        return plan_figure(
            result.model.num_layers, spec.every_n_layers, title=t("fig.did_not_fit", lang, setting=setting), lang=lang
        )
    layers = result.layers
    hover = [_layer_hover(layer, lang) for layer in layers]
    # MoE: a rerun seen on the router and the experts themselves says so in its box.
    moe_reruns = [
        layer.moe and layer.router_recompute_calls > 0 and layer.experts_recompute_calls > 0 for layer in layers
    ]
    rows = [
        _Row(t("fig.forward_row", lang), [layer.enabled for layer in layers], hover, planned=False),
        _Row(
            t("fig.backward_row", lang),
            ["rerun" if layer.recompute_calls else "keep" for layer in layers],
            hover,
            planned=False,
            extra=[t("fig.moe_rerun_box", lang) if rerun else "" for rerun in moe_reruns],
        ),
    ]
    # A simulated step is observed too, on fake tensors: the title says which.
    seen = t("fig.seen_simulated" if result.provenance.kind == "simulated" else "fig.seen_observed", lang)
    title = t("fig.what_step_did", lang, setting=setting, seen=seen)
    if not result.plan_matches:
        planned_hover = [t("fig.planned_hover", lang, name=layer.name, role=layer.planned) for layer in layers]
        rows += [
            _Row(t("fig.planned_forward", lang), [layer.planned for layer in layers], planned_hover, planned=True),
            _Row(
                t("fig.planned_backward", lang),
                ["rerun" if layer.planned == "CP" else "keep" for layer in layers],
                planned_hover,
                planned=True,
            ),
        ]
        title = t("fig.differs", lang, setting=setting)
    subtitle = t(f"provenance.{result.provenance.kind}", lang, device=result.provenance.device_name)
    if any(moe_reruns):
        subtitle += " · " + t("fig.moe_subtitle", lang, count=sum(moe_reruns))
    return _diagram(rows, title, subtitle=subtitle, lang=lang)


def plan_figure(num_layers: int, every_n_layers: int | None, title: str | None = None, lang: str = "en") -> go.Figure:
    """The pattern every_n_layers plans, before anything ran (hatched, like all planned rows).

    Args:
        num_layers: checkpointable layers of the model.
        every_n_layers: the setting, ``None`` for checkpointing off.
        title: replaces the default title.
        lang: language of the words on the figure (``ckptlab.show.i18n``).

    Returns:
        A Plotly figure with a planned forward and backward row.
    """
    roles = planned_roles(num_layers, every_n_layers)
    hover = [t(f"fig.plan_hover_{role}", lang, n=index + 1) for index, role in enumerate(roles)]
    rows = [
        _Row(t("fig.forward_row", lang), roles, hover, planned=True),
        _Row(t("fig.backward_row", lang), ["rerun" if role == "CP" else "keep" for role in roles], hover, planned=True),
    ]
    default = t("fig.plan_title", lang, setting=_setting(every_n_layers, False, lang))
    return _diagram(rows, title or default, subtitle=t("fig.plan_subtitle", lang), lang=lang)


def _setting(every_n_layers: int | None, offload: bool, lang: str) -> str:
    """``report.setting_name`` in ``lang`` (the same words in English)."""
    if every_n_layers is None:
        return t("setting.off", lang)
    return t("setting.on_offload" if offload else "setting.on", lang, n=every_n_layers)


def _layer_hover(layer: LayerResult, lang: str = "en") -> str:
    text = t(
        "fig.layer_hover",
        lang,
        name=layer.name,
        module=layer.module,
        calls=layer.forward_calls,
        reruns=layer.recompute_calls,
        saved=f"{layer.saved_bytes / MIB:,.2f}",
        saved_bytes=f"{layer.saved_bytes:,}",
        input=f"{layer.input_bytes / MIB:,.2f}",
        planned=layer.planned,
        flag=layer.enabled,
        observed=layer.observed,
    )
    if layer.moe:
        text += t(
            "fig.layer_hover_moe", lang, router=layer.router_recompute_calls, experts=layer.experts_recompute_calls
        )
    return text


def _diagram(rows: list[_Row], title: str, subtitle: str, lang: str = "en") -> go.Figure:
    count = len(rows[0].roles)
    per_line = min(count, LAYERS_PER_LINE) or 1
    lines = (count + per_line - 1) // per_line or 1
    rows_per_line = len(rows)
    pitch = rows_per_line + 0.6  # a gap between wrapped lines
    text_size = 20 if per_line <= 8 else 16

    tick_vals: list[float] = []
    tick_text: list[str] = []
    traces: dict[tuple[str, bool], dict[str, list]] = {}
    for line in range(lines):
        first, last = line * per_line, min((line + 1) * per_line, count)
        for row_index, row in enumerate(rows):
            y = -(line * pitch + row_index)
            tick_vals.append(y)
            tick_text.append(row.label if lines == 1 else f"{row.label}<br>L{first + 1}–L{last}")
            for index in range(first, last):
                role = row.roles[index]
                bucket = traces.setdefault((role, row.planned), {"x": [], "base": [], "text": [], "hover": []})
                bucket["x"].append(index - first)
                bucket["base"].append(y - 0.42)
                extra = row.extra[index] if row.extra else ""
                bucket["text"].append(f"L{index + 1}<br><b>{role}</b>" + (f"<br>{extra}" if extra else ""))
                bucket["hover"].append(row.hover[index])

    figure = go.Figure()
    for role in ("CP", "keep", "rerun"):
        for planned in (False, True):
            if (role, planned) not in traces:
                continue
            bucket = traces[(role, planned)]
            figure.add_trace(
                go.Bar(
                    x=bucket["x"],
                    y=[0.84] * len(bucket["x"]),
                    base=bucket["base"],
                    width=0.86,
                    name=t(f"diagram.legend_{role}", lang) + (t("fig.planned_suffix", lang) if planned else ""),
                    legendgroup=role,
                    marker={
                        "color": COLORS[role],
                        "line": {"color": "white", "width": 2},
                        "pattern": (
                            # Thin, sparse stripes: visibly "planned" while the words stay readable.
                            {
                                "shape": PLANNED_PATTERN,
                                "bgcolor": COLORS[role],
                                "fgcolor": HATCH[role],
                                "size": 14,
                                "solidity": 0.25,
                            }
                            if planned
                            else {"shape": ""}
                        ),
                    },
                    text=bucket["text"],
                    textposition="inside",
                    insidetextanchor="middle",
                    textangle=0,
                    textfont={"color": "white", "size": text_size, "family": FONT},
                    hovertext=bucket["hover"],
                    hoverinfo="text",
                )
            )
    row_px = 78 if per_line <= 8 else 70
    # Explicit room for the row labels: Streamlit's plotly.js cuts them off with automargin alone.
    longest = max(len(part) for text in tick_text for part in text.split("<br>"))
    legend_rows = 1 if len(figure.data) <= 2 else 2
    figure.update_layout(
        title={"text": title, "subtitle": {"text": subtitle}, "font": {"size": 20}, "x": 0, "xref": "paper"},
        barmode="overlay",
        height=int(95 + 34 * legend_rows + lines * pitch * row_px),
        margin={"l": 24 + 9 * longest, "r": 10, "t": 75, "b": 10 + 34 * legend_rows},
        legend={"orientation": "h", "yanchor": "top", "y": -0.02, "x": 0, "font": {"size": 15}},
        font={"family": FONT, "size": 15},
        hoverlabel={"font": {"size": 15}},
        plot_bgcolor="white",
        uniformtext={"minsize": 10, "mode": "show"},
    )
    figure.update_xaxes(visible=False, range=[-0.5, per_line - 0.5], fixedrange=True)
    figure.update_yaxes(
        tickvals=tick_vals,
        ticktext=tick_text,
        tickfont={"size": 16},
        range=[-((lines - 1) * pitch + rows_per_line - 1) - 0.5, 0.5],
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )
    return figure


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
        raise ValueError(f"a run with status {result.status!r} has no measurements to chart")
    series = [
        (_setting(result.spec.every_n_layers, result.spec.offload, lang), result.memory, result.timing, RUN_COLOR)
    ]
    if result.spec.every_n_layers is None:
        series = [(t("setting.off", lang), result.memory, result.timing, OFF_COLOR)]
    elif baseline is not None and baseline.memory is not None and baseline.timing is not None:
        series.append((t("setting.off", lang), baseline.memory, baseline.timing, OFF_COLOR))

    figure = make_subplots(rows=1, cols=2, subplot_titles=(t("fig.memory_panel", lang), t("fig.time_panel", lang)))
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
                text=[f"{value:,.1f}" for value in memory_mib],
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
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [(max(s, default=m) - m) * 1000 for s, m in zip(samples, medians)],
                    "arrayminus": [(m - min(s, default=m)) * 1000 for s, m in zip(samples, medians)],
                    "color": "#333333",
                },
                hovertemplate="%{x}: %{y:,.0f} ms " + t("fig.median", lang) + "<extra>" + name + "</extra>",
            ),
            row=1,
            col=2,
        )
    figure.update_layout(
        barmode="group",
        height=360,
        margin={"l": 55, "r": 10, "t": 70, "b": 55},  # room for the two-line category labels
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.12, "x": 0, "font": {"size": 14}},
        font={"family": FONT, "size": 14},
        plot_bgcolor="white",
    )
    figure.update_yaxes(gridcolor="#e5e5e5", rangemode="tozero")
    return figure
