"""The one font and the one palette of every figure of the lab.

Colours are Okabe-Ito's, and three of Paul Tol's muted scheme where Okabe-Ito's eight run out: told
apart by colour-blind readers and on a washed-out projector. A colour has one meaning: what a layer
does (CP, keep, rerun: ``ROLE_COLORS``), where memory goes (``CATEGORY_COLORS``) and which setting a
bar or line is (``SETTING_COLORS``) never share a hue, since a page draws them side by side
(``tests/show/figures/test_palette.py`` checks it). Settings are neutral (checkpointing off grey, a
checkpointed run black), so the hues stay with what memory holds and what a layer does; offload's
colour is the host memory's, the one thing the two say alike. The phases of a step (``PHASE_COLORS``)
are neutral washes behind the timeline, lighter than anything drawn on or beside them, and whether a
setting fits a GPU (``VERDICT_COLORS``) is told by a marker's shape in a neutral colour: neither takes a
hue from the memory categories or the roles drawn next to them.
Streamlit's plotly.js (4.x) draws nothing for a pattern with an rgba fgcolor: hex colours only.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

from ..i18n import separators

FONT = "Arial, Helvetica, sans-serif"


def on_white(size: int, lang: str) -> dict[str, Any]:
    """The layout every figure shares: the one font at ``size``, on a white plot, numbers (ticks, hover labels) in
    ``lang``'s decimal mark and thousands separator (``update_layout(**on_white(14, lang))``)."""
    return {"font": {"family": FONT, "size": size}, "plot_bgcolor": "white", "separators": separators(lang)}


# The wide layout's main column at a projector's 1280x720 with the sidebar open (measured in Chromium: 380 to
# 1200 px), and st.columns' gap: a figure sized from the page's width reads it here, the page says its column's share.
PAGE_PX = 820
COLUMN_GAP_PX = 16


def column_px(share: float, columns: int = 2) -> int:
    """Pixels of a figure drawn in a column that takes ``share`` of the page's width, among ``columns`` columns, at
    1280x720 (the Lab page's diagram in a 3:2 split: ``column_px(0.6)``, 482 px)."""
    return int((PAGE_PX - COLUMN_GAP_PX * (columns - 1)) * share)


# A title's line, in characters of a Latin font (a CJK character counts two): a figure half of a 1280-pixel
# screen's page is about 320-480 px wide, and plotly neither wraps a title nor keeps it inside the figure.
TITLE_CHARS = {"large": 38, "normal": 40}
# A subtitle's characters in pixels, at plotly's subtitle size in Chromium (the Lab's breakdown at 1280x720, IPAGothic
# for Japanese): a Latin one about 5.9 (a unit), a CJK one about 13, so 2.2 units where it is counted by pixels. A
# narrow figure (a 0.4 column: 321 px) holds fewer than TITLE_CHARS x 1.3 of them: its subtitle wraps sooner.
SUBTITLE_UNIT_PX = 6.0
SUBTITLE_WIDE_UNITS = 2.2


def wrapped(text: str, width: int, wide: float = 2) -> str:
    """``text`` broken into lines (plotly's ``<br>``) of at most ``width`` characters, a wide (CJK) one counting
    ``wide``, at spaces where there are any (Japanese has none: there it breaks between characters, never before a
    closing mark); a line it already breaks is kept."""
    lines = []
    for paragraph in text.split("<br>"):
        line, used = "", 0.0
        for token in _tokens(paragraph):
            size = sum(wide if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in token)
            if line and used + size > width:
                lines.append(line.rstrip())
                line, used = token.lstrip(), size - (len(token) - len(token.lstrip()))
            else:
                line, used = line + token, used + size
        lines.append(line.rstrip())
    return "<br>".join(lines)


# Japanese punctuation that never begins a line (kinsoku): it stays with the character before it.
NO_LINE_START = frozenset("、。，．）」』】〕・ーっゃゅょァィゥェォッャュョ")


def _tokens(text: str) -> list[str]:
    """Words with the space before them, and each wide (CJK) character on its own, a closing mark or a small kana
    with the one before it (:data:`NO_LINE_START`): the places a line may break."""
    tokens: list[str] = []
    for ch in text:
        wide = unicodedata.east_asian_width(ch) in "WF"
        if tokens and ch in NO_LINE_START:
            tokens[-1] += ch
        elif not tokens or wide or ch == " " or (unicodedata.east_asian_width(tokens[-1][-1]) in "WF"):
            tokens.append(ch)
        else:
            tokens[-1] += ch
    return tokens


def heading(
    text: str, subtitle: str | None = None, size: int | None = None, width_px: int | None = None
) -> dict[str, Any]:
    """A figure's title at the figure's left edge (not the plot's: the room of the axis labels is the title's too),
    the subtitle (where numbers come from) under it, at ``size`` if given; both wrapped to fit a projector's
    half-screen figure (the subtitle to ``width_px`` where the figure is narrower), and the top margin grown to hold
    them."""
    width = TITLE_CHARS["large" if size and size >= 18 else "normal"]
    text = wrapped(text, width)
    # From the figure's top edge down, the top margin grown to hold every line (a title anchored in the margin's
    # middle grows past the figure's top edge, where the SVG clips it). Plotly anchors a title's first line at the
    # top and does not move it down for the lines under it: the pad does (measured in Chromium, plotly.js 4.1).
    line_px = round(1.25 * (size or 17))
    lines = text.count("<br>")
    title: dict[str, Any] = {
        "text": text,
        "x": 0,
        "xref": "container",
        "y": 1,
        "yref": "container",
        "yanchor": "top",
        "automargin": True,
        "pad": {"l": 8, "t": 8 + (line_px * lines + round(1.1 * (size or 17)) if lines else 0)},
    }
    if subtitle is not None:
        if width_px is None:
            title["subtitle"] = {"text": wrapped(subtitle, int(width * 1.3))}  # a smaller font
        else:  # counted by pixels: the figure's width, less the title's pad on either side
            chars = min(int(width * 1.3), int((width_px - 16) / SUBTITLE_UNIT_PX))
            title["subtitle"] = {"text": wrapped(subtitle, chars, SUBTITLE_WIDE_UNITS)}
    if size:
        title["font"] = {"size": size}
    return title


def legend(y: float, yanchor: str = "top", **more: Any) -> dict[str, Any]:
    """A horizontal legend from the left edge: under the plot (``y`` below 0) or over it (``yanchor="bottom"``)."""
    return {"orientation": "h", "yanchor": yanchor, "y": y, "x": 0, **more}


def whiskers(up: Sequence[float], down: Sequence[float], color: str) -> dict[str, Any]:
    """Error bars reaching ``up`` above and ``down`` below each value: the slowest and the fastest of the repeats."""
    return {"type": "data", "symmetric": False, "array": list(up), "arrayminus": list(down), "color": color}


# Okabe-Ito, by name.
BLUE = "#0072B2"
VERMILLION = "#D55E00"
ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
GREEN = "#009E73"
PURPLE = "#CC79A7"
YELLOW = "#F0E442"
BLACK = "#000000"
# Paul Tol's muted scheme, for the layer roles: hues none of the above has.
ROSE = "#CC6677"
INDIGO = "#332288"
OLIVE = "#999933"
# Neutrals, told apart by lightness.
DARK_GREY = "#555555"
GREY = "#999999"
LIGHT_GREY = "#BBBBBB"
PALE_GREY = "#DDDDDD"
GRID = "#e5e5e5"
LIGHT_GRID = "#f0f0f0"
WHITE = "#FFFFFF"
TEXT_GREY = "#333333"  # annotations on a figure
OUTLINE_GREY = "#666666"  # a marker's outline, a secondary annotation
LEGEND_BACKGROUND = "rgba(255,255,255,0.85)"  # a legend over the plot, the plot showing through


def tint(color: str, amount: float) -> str:
    """``color`` moved ``amount`` (0 to 1) of the way to white, as hex."""
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * amount):02X}" for c in (red, green, blue))


# What a layer does in the step; planned rows are hatched in each colour a quarter of the way to white.
ROLE_COLORS = {"CP": ROSE, "rerun": OLIVE, "keep": INDIGO}
HATCH_COLORS = {role: tint(color, 0.25) for role, color in ROLE_COLORS.items()}

# Which setting: neutral, from checkpointing off (grey) to every layer checkpointed (black); offload is the host's colour.
SETTING_COLORS = {"off": GREY, "partial": DARK_GREY, "full": BLACK, "offload": PURPLE}
OFF_COLOR = SETTING_COLORS["off"]
RUN_COLOR = SETTING_COLORS["full"]  # the checkpointed run beside checkpointing off
EXTRA_COLORS = (DARK_GREY, tint(BLACK, 0.45))  # further checkpointed settings beside those two, neutral as they are
NOISE_GREY = LIGHT_GREY  # a point or bar whose time is within the noise: lighter than any setting
SERIES_COLORS = (BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY_BLUE, YELLOW, BLACK)  # one per line, in order

# Where the bytes of a step go (ckptlab.step.memory_meters' categories), and offload's host memory.
CATEGORY_COLORS = {
    "parameter": BLUE,
    "gradient": SKY_BLUE,
    "optimizer_state": GREEN,
    "activation": VERMILLION,
    "temp": ORANGE,
    "activation_and_temp": VERMILLION,
    "other": PALE_GREY,
    "host": PURPLE,
}
PEAK_COLOR = tint(VERMILLION, 0.5)  # memory at the peak above the baseline: mostly activations and temp
HOST_PATTERN = {"shape": "/", "bgcolor": tint(PURPLE, 0.75), "fgcolor": PURPLE, "size": 8, "solidity": 0.45}

# The phases of a step, as washes behind the timeline: neutral, told apart from their neighbours by
# lightness (and named by the label over each), all lighter than the palest category ("other").
PHASE_COLORS = {
    "forward": tint(BLACK, 0.93),
    "loss": tint(BLACK, 0.97),
    "backward": tint(BLACK, 0.9),
    "optimizer": tint(BLACK, 0.95),
}
PHASE_LABEL_COLOR = TEXT_GREY  # the name over each phase: a wash is too pale to write in
# The grid over the washes: GRID is the backward's own wash (#e5e5e5), so it vanished there; a step darker
# than the darkest wash, still lighter than any line drawn on it.
WASH_GRID = tint(BLACK, 0.8)
# The shading of each stretch of the timeline: its phase's wash, and each rerun in the rerun role's colour.
BAND_COLORS = {**PHASE_COLORS, "rerun": ROLE_COLORS["rerun"]}
# The state of a layer at one moment of the step: the roles' colours where a state is a role's, neutrals
# (told apart by lightness) otherwise, since the Lesson draws it beside the memory categories.
STATE_COLORS = {
    "pending": tint(PALE_GREY, 0.5),
    "running": DARK_GREY,
    "held": ROLE_COLORS["keep"],
    "input_only": ROLE_COLORS["CP"],
    "recomputing": ROLE_COLORS["rerun"],
    "backward": tint(BLACK, 0.55),
    "freed": LIGHT_GREY,
}
CURSOR_COLOR = BLACK

# Sweeps: what was measured, the two predictions, the frontier and a budget.
MEASURED_COLOR = BLUE
FORMULA_COLOR = ORANGE
CALIBRATED_COLOR = SKY_BLUE
FRONTIER_COLOR = VERMILLION
BUDGET_COLOR = BLACK
GUESS_COLOR = SKY_BLUE  # a participant's prediction in an exercise
# Whether a setting fits a GPU: told by the shape, in neutrals, since the marks sit on bars in the
# memory categories' colours (green was the optimizer state's, vermillion is the activations').
VERDICT_SYMBOLS = {True: "circle", False: "x"}
VERDICT_COLORS = {True: DARK_GREY, False: BLACK}
