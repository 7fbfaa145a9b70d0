"""The CP / keep / rerun diagram: a run's step, the plan of a setting, or bare roles with the layer at work outlined.

The diagram follows the text diagram of show/report.py (the README's sample output): a
forward row saying what each layer keeps (CP or keep) and a backward row saying what the
backward does there (rerun or keep), layers in order from left to right, wrapped every
:data:`LAYERS_PER_LINE` layers so that a 36-layer model stays legible on a projector. Boxes
are bars (so they scale with the figure, carry hover text and make a legend), with the role
written inside. Planned rows are hatched so they never pass for observed ones.

All three builders draw through one function: the boxes, colours and legend are the same
on every page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from ...model.plan import planned_roles, rerun_inside, rerun_roles
from ...model.selective import selective_key
from ...results import LayerResult, Region, RunResult, TimelinePoint
from ...units import MIB
from ..i18n import number, t
from ..labels import provenance_label, setting_label
from ._style import CURSOR_COLOR, FONT, HATCH_COLORS, ROLE_COLORS, column_px, heading, legend, on_white

LAYERS_PER_LINE = 12  # at most, where the figure is wide enough (fewer where a box would not hold its role)
ROLES = ("CP", "keep", "rerun")
COLUMN_PX = column_px(0.6)  # by default the narrowest a page draws a diagram in: the Lab's result, beside the memory
# The words in a box, by figure kind: drawn at the larger size, which plotly shrinks to fit a box down to the
# smaller one (uniformtext's minsize) and never below it: a narrower figure wraps into more lines instead.
TEXT_SIZES = {"titled": (20, 16), "compact": (18, 14)}
WIDEST_ROLE_EM = 2.6  # "rerun" in bold Arial (Liberation Sans in Chromium): 2.56 em, measured
BOX_PAD_PX = 6  # plotly's inside-text padding, 3 px a side
BOX_SHARE = 0.86  # a box's width in its slot


@dataclass(frozen=True)
class _Row:
    label: str  # y-axis words, e.g. "Forward →"
    phase: str  # "forward" or "backward": which row a focus outlines
    roles: Sequence[str]  # "CP" / "keep" / "rerun", one per layer in model order
    hover: Sequence[str]  # one per layer
    planned: bool = False  # hatched, legend says "(planned)"
    extra: Sequence[str] = ()  # a short line under the role in a box, one per layer ("" for none)


def diagram_figure(result: RunResult, lang: str = "en", *, width: int = COLUMN_PX) -> go.Figure:
    """The step a run observed: forward row from the flags, backward row from the reruns.

    When the observed pattern differs from the every_n_layers rule, the planned rows are
    added below (hatched) and the title says so. A run that did not fit has no layers;
    its planned pattern is drawn instead, titled as such.

    Args:
        result: a :class:`~ckptlab.RunResult`.
        lang: language of the words on the figure (``ckptlab.show.i18n``).
        width: pixels the page draws the figure in (a column of the page at 1280x720): the layers wrap into as
            many lines as their boxes need to hold their roles.

    Returns:
        A Plotly figure; hover on a box shows what was measured for that layer.
    """
    spec = result.spec
    setting = setting_label(spec.every_n_layers, result.memory.offload_applied if result.memory else False, lang)
    if not result.layers:
        return plan_figure(
            result.model.num_layers,
            spec.every_n_layers,
            title=t("fig.did_not_fit", lang, setting=setting),
            lang=lang,
            width=width,
        )
    layers = result.layers
    hover = [_layer_hover(layer, lang) for layer in layers]
    # MoE: a rerun seen on the router and the experts themselves says so in its box.
    moe_reruns = [
        layer.moe and layer.router_recompute_calls > 0 and layer.experts_recompute_calls > 0 for layer in layers
    ]
    # A selective policy: the subtitle says what the CP layers kept (observed bytes) and that their reruns did the
    # rest; a box a layer's width wide (40 px for six layers at 1280x720) holds no more than its name and role.
    selective = spec.selective != "none"
    # A keep layer nested in a checkpointed one reruns with it: its backward box says inside whose rerun.
    rest = [
        t("fig.reruns_inside", lang, parent=f"L{layer.rerun_inside + 1}") if layer.rerun_inside is not None else ""
        for layer in layers
    ]
    rows = [
        _Row(t("diagram.forward", lang), "forward", [layer.enabled for layer in layers], hover),
        _Row(
            t("diagram.backward", lang),
            "backward",
            ["rerun" if layer.recompute_calls else "keep" for layer in layers],
            hover,
            extra=[
                "<br>".join(part for part in (t("fig.moe_rerun_box", lang) if moe else "", more) if part)
                for moe, more in zip(moe_reruns, rest)
            ],
        ),
    ]
    # A simulated step is observed too, on fake tensors: the title says which.
    seen = t("fig.seen_simulated" if result.provenance.kind == "simulated" else "fig.seen_observed", lang)
    title = t("fig.what_step_did", lang, setting=setting, seen=seen)
    if not result.plan_matches:
        planned_hover = [t("fig.planned_hover", lang, name=layer.name, role=layer.planned) for layer in layers]
        planned = [layer.planned for layer in layers]
        rows += [
            _Row(t("fig.planned_forward", lang), "forward", planned, planned_hover, planned=True),
            _Row(t("fig.planned_backward", lang), "backward", _backward(planned), planned_hover, planned=True),
        ]
        title = t("fig.differs", lang, setting=setting)
    subtitle = provenance_label(result.provenance, lang)
    if selective:  # a line of its own: the provenance and the policy in one line ran past a column's edge
        sizes = sorted({layer.kept_bytes for layer in layers if layer.enabled == "CP"})
        kept = "–".join(_bytes(size, lang) for size in sizes[:1] + sizes[1:][-1:]) or _bytes(0, lang)
        subtitle += "<br>" + t("selective.diagram_subtitle", lang, policy=selective_key(spec.selective), kept=kept)
    if any(moe_reruns):
        subtitle += " · " + t("fig.moe_subtitle", lang, count=sum(moe_reruns))
    return _draw(rows, lang, title=title, subtitle=subtitle, width=width)


def plan_figure(
    num_layers: int,
    every_n_layers: int | None,
    title: str | None = None,
    lang: str = "en",
    nested: Sequence[int | None] = (),
    width: int = COLUMN_PX,
) -> go.Figure:
    """The pattern every_n_layers plans, before anything ran (hatched, like all planned rows).

    Args:
        num_layers: checkpointable layers of the model.
        every_n_layers: the setting, ``None`` for checkpointing off.
        title: replaces the default title.
        lang: language of the words on the figure (``ckptlab.show.i18n``).
        nested: ``ModelInfo.nested_in``: a keep layer inside a checkpointed one is planned to rerun with it.
        width: pixels the page draws the figure in (as :func:`diagram_figure`).

    Returns:
        A Plotly figure with a planned forward and backward row.
    """
    roles = planned_roles(num_layers, every_n_layers)
    hover = [t(f"fig.plan_hover_{role}", lang, n=index + 1) for index, role in enumerate(roles)]
    inside = rerun_inside(roles, nested) if nested else [None] * num_layers
    extra = [t("fig.reruns_inside", lang, parent=f"L{parent + 1}") if parent is not None else "" for parent in inside]
    rows = [
        _Row(t("diagram.forward", lang), "forward", roles, hover, planned=True),
        _Row(
            t("diagram.backward", lang),
            "backward",
            _backward(rerun_roles(roles, nested)),
            hover,
            planned=True,
            extra=extra,
        ),
    ]
    default = t("fig.plan_title", lang, setting=setting_label(every_n_layers, False, lang))
    return _draw(rows, lang, title=title or default, subtitle=t("fig.plan_subtitle", lang), width=width)


def roles_diagram_figure(
    roles: Sequence[str],
    *,
    lang: str = "en",
    focus: tuple[int, str] | None = None,
    reruns: Sequence[int] | None = None,
    height: int | None = None,
    width: int = COLUMN_PX,
) -> go.Figure:
    """The diagram of given roles, untitled and compact (beside other figures), the layer at work outlined.

    Args:
        roles: per layer "CP" or "keep" (the forward row); the backward row says "rerun"
            where a layer reran (``reruns``, observed counts) or, without counts, where it is CP.
        lang: language of the labels.
        focus: ``(layer, "forward" | "backward")`` to outline (see :func:`focus_of`); the other boxes fade.
        reruns: observed reruns per layer, from the run's layer rows.
        height: pixels; by default from the number of layers.
        width: pixels the page draws the figure in (as :func:`diagram_figure`).
    """
    back = ["rerun" if reruns[i] else "keep" for i in range(len(roles))] if reruns is not None else _backward(roles)
    rows = [
        _Row(
            t(f"diagram.{phase}", lang),
            phase,
            row_roles,
            [t(f"diagram.hover_{role}", lang, n=i + 1) for i, role in enumerate(row_roles)],
        )
        for phase, row_roles in (("forward", list(roles)), ("backward", back))
    ]
    return _draw(rows, lang, focus=focus, height=height, width=width)


def focus_of(point: TimelinePoint | Region) -> tuple[int, str] | None:
    """The layer at work at one event of a timeline, and in which row of the diagram: None outside the layers."""
    if point.layer is None:
        return None
    return point.layer, "backward" if point.phase == "backward" else "forward"


def _backward(roles: Sequence[str]) -> list[str]:
    """What the backward plans to do at each layer: rerun a CP layer, nothing more at a keep one."""
    return ["rerun" if role == "CP" else "keep" for role in roles]


def _bytes(count: int, lang: str) -> str:
    """A kept size that reads in a small box: MiB from 1 MiB, KiB below."""
    return f"{number(count / MIB, ',.1f', lang)} MiB" if count >= MIB else f"{number(count / 1024, ',.1f', lang)} KiB"


def _layer_hover(layer: LayerResult, lang: str = "en") -> str:
    text = t(
        "fig.layer_hover",
        lang,
        name=layer.name,
        module=layer.module,
        calls=layer.forward_calls,
        reruns=layer.recompute_calls,
        saved=number(layer.saved_bytes / MIB, ",.2f", lang),
        saved_bytes=number(layer.saved_bytes, ",", lang),
        input=number(layer.input_bytes / MIB, ",.2f", lang),
        planned=layer.planned,
        flag=layer.enabled,
        observed=layer.observed,
    )
    if layer.attention_bytes:
        text += t(
            "fig.layer_hover_attention",
            lang,
            kept=f"{layer.attention_bytes / MIB:,.2f}",
            kept_bytes=f"{layer.attention_bytes:,}",
        )
    if layer.moe:
        text += t(
            "fig.layer_hover_moe", lang, router=layer.router_recompute_calls, experts=layer.experts_recompute_calls
        )
    if layer.selective != "none":
        text += t(
            "selective.diagram_hover",
            lang,
            policy=layer.selective,
            kept=number(layer.kept_bytes, ",", lang),
            ops=", ".join(f"{name} x{count}" for name, count in layer.kept_ops.items()) or "-",
            reused=sum(layer.reused_ops.values()),
            rerun=sum(layer.rerun_ops.values()),
        )
    return text


def _draw(
    rows: list[_Row],
    lang: str,
    *,
    title: str | None = None,
    subtitle: str = "",
    focus: tuple[int, str] | None = None,
    height: int | None = None,
    width: int = COLUMN_PX,
) -> go.Figure:
    """The boxes of ``rows``, wrapped into lines; untitled diagrams are compact (they sit beside other figures)."""
    compact = title is None
    count = len(rows[0].roles)
    labels = [row.label for row in rows] + ["L1–L12"]  # a wrapped line's tick says its layers under the row's name
    left_px = 24 + 9 * max(len(label) for label in labels)  # explicit: plotly.js cuts row labels with automargin alone
    text_size, least = TEXT_SIZES["compact" if compact else "titled"]
    per_line = layers_per_line(count, width - left_px - 10, least)
    lines = (count + per_line - 1) // per_line or 1
    pitch = len(rows) + 0.6  # a gap between wrapped lines
    small = per_line > 8

    tick_vals: list[float] = []
    tick_text: list[str] = []
    boxes: dict[tuple[str, bool], dict[str, list]] = {}
    for line in range(lines):
        first, last = line * per_line, min((line + 1) * per_line, count)
        for row_index, row in enumerate(rows):
            y = -(line * pitch + row_index)
            tick_vals.append(y)
            tick_text.append(row.label if lines == 1 else f"{row.label}<br>L{first + 1}–L{last}")
            for index in range(first, last):
                role = row.roles[index]
                box = boxes.setdefault((role, row.planned), {"x": [], "base": [], "text": [], "hover": [], "at": []})
                box["x"].append(index - first)
                box["base"].append(y - 0.42)
                extra = row.extra[index] if row.extra else ""
                box["text"].append(f"L{index + 1}<br><b>{role}</b>" + (f"<br>{extra}" if extra else ""))
                box["hover"].append(row.hover[index])
                box["at"].append(focus is not None and focus == (index, row.phase) and not row.planned)

    figure = go.Figure()
    for role in ROLES:
        for planned in (False, True):
            if (role, planned) not in boxes:
                continue
            box = boxes[(role, planned)]
            figure.add_trace(
                go.Bar(
                    x=box["x"],
                    y=[0.84] * len(box["x"]),
                    base=box["base"],
                    width=0.86,
                    name=t(f"diagram.legend_{role}", lang) + (t("fig.planned_suffix", lang) if planned else ""),
                    legendgroup=role,
                    marker={
                        "color": ROLE_COLORS[role],
                        "pattern": _pattern(role, planned),
                        **_outline(box["at"], focus),
                    },
                    text=box["text"],
                    textposition="inside",
                    insidetextanchor="middle",
                    textangle=0,
                    textfont={"color": "white", "size": text_size, "family": FONT},
                    hovertext=box["hover"],
                    hoverinfo="text",
                )
            )
    if title is None:  # untitled, compact
        size = 14
        layout = {"height": height or 60 + 190 * lines, "margin": {"l": left_px, "r": 10, "t": 10, "b": 50}}
    else:
        size = 15
        legend_rows = 1 if len(figure.data) <= 2 else 2
        row_px = 70 if small else 78
        heading_layout = heading(title, subtitle, size=20)
        # Each line of the title (25 px) and of the subtitle (18 px) past the first of each: the top margin grows
        # by it, and so does the figure, or the rows are squashed until their boxes' words overlap (a selective
        # policy's subtitle is two lines).
        more_top = 25 * heading_layout["text"].count("<br>") + 18 * heading_layout.get("subtitle", {}).get(
            "text", ""
        ).count("<br>")
        layout = {
            "title": heading_layout,
            "height": height or int(95 + more_top + 34 * legend_rows + lines * pitch * row_px),
            "margin": {"l": left_px, "r": 10, "t": 75 + more_top, "b": 10 + 34 * legend_rows},
            "hoverlabel": {"font": {"size": 15}},
        }
    figure.update_layout(
        barmode="overlay",
        legend=legend(-0.02, font={"size": size}),
        **on_white(size, lang),
        uniformtext={"minsize": least, "mode": "show"},
        **layout,
    )
    figure.update_xaxes(visible=False, range=[-0.5, per_line - 0.5], fixedrange=True)
    figure.update_yaxes(
        tickvals=tick_vals,
        ticktext=tick_text,
        tickfont={"size": size + 1},
        range=[-((lines - 1) * pitch + len(rows) - 1) - 0.5, 0.5],
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )
    return figure


def layers_per_line(count: int, plot_px: float, text_size: int) -> int:
    """How many of ``count`` layers a line of a plot ``plot_px`` wide holds: the fewest lines (of at most
    :data:`LAYERS_PER_LINE`) whose boxes hold their widest role ("rerun") at ``text_size``, with as many layers in
    each line as the others (12 layers as 6 + 6, not 10 + 2)."""
    lines = max(1, -(-count // LAYERS_PER_LINE))
    per_line = -(-count // lines) if count else 1
    while per_line > 1 and plot_px / per_line * BOX_SHARE < WIDEST_ROLE_EM * text_size + BOX_PAD_PX:
        lines += 1
        per_line = -(-count // lines)
    return per_line


def _pattern(role: str, planned: bool) -> dict:
    """Planned boxes: thin, sparse stripes, visibly "planned" while the words stay readable; observed ones solid."""
    if not planned:
        return {"shape": ""}
    return {"shape": "/", "bgcolor": ROLE_COLORS[role], "fgcolor": HATCH_COLORS[role], "size": 14, "solidity": 0.25}


def _outline(at: list[bool], focus: tuple[int, str] | None) -> dict:
    """The box at work outlined in the cursor's colour, the others faded; white borders when nothing is in focus."""
    if focus is None:
        return {"line": {"color": "white", "width": 2}}
    return {
        "opacity": [1.0 if here else 0.45 for here in at],
        "line": {
            "color": [CURSOR_COLOR if here else "white" for here in at],
            "width": [6 if here else 2 for here in at],
        },
    }
