"""One colour, one meaning: a layer's role, a memory category and a setting never share a hue; the phases
of a step and the fits / does-not-fit verdict take none of the hues of the groups they are drawn with;
and the figures take every colour from ``ckptlab/show/figures/_style.py``.

Two colours "share a hue" when both are chromatic and their hues lie within ``HUE_APART`` degrees
(vermillion and orange are 15 degrees apart, and a reader calls both orange), or when both are
neutral (greys, black) and their lightness lies within ``LIGHTNESS_APART``.
"""

from __future__ import annotations

import colorsys
import re
from itertools import combinations, pairwise
from pathlib import Path

import pytest

import ckptlab.show.figures._style as style

FIGURES = Path(style.__file__).parent
HUE_APART = 18.0  # degrees
LIGHTNESS_APART = 0.1
CHROMATIC = 0.15  # saturation above which a colour has a hue
FAMILIES = {"role": style.ROLE_COLORS, "category": style.CATEGORY_COLORS, "setting": style.SETTING_COLORS}
# The one meaning two families say alike: offload moves what the host memory then holds.
SAME_MEANING = {frozenset({("setting", "offload"), ("category", "host")})}
# Groups drawn beside the families, and the families they are drawn with: the verdict marks sit on the
# At-scale figure's category bars; the Lesson page shows the phased timeline beside the memory breakdown,
# the layer roles and the settings' lines (drawn over the washes).
VERDICTS = {"fits" if fit else "does not fit": color for fit, color in style.VERDICT_COLORS.items()}
# A layer's states that are not a role's (held is keep's colour, recomputing rerun's) sit beside the categories too.
STATES = {name: style.STATE_COLORS[name] for name in ("running", "backward", "freed")}
DRAWN_WITH = {
    "verdict": (VERDICTS, ("category", "role")),
    "state": (STATES, ("category", "role")),
    "phase": (style.PHASE_COLORS, ("category", "role", "setting")),
}
# Keys of one family that are one meaning: the categories a meter cannot tell apart, drawn as the activations.
MERGED = {frozenset({"activation", "activation_and_temp"})}
HEX = re.compile(r"#[0-9A-Fa-f]{3,8}\b|\brgba?\(")


def _hls(color: str) -> tuple[float, float, float]:
    red, green, blue = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hls(red, green, blue)


def share_a_hue(one: str, other: str) -> bool:
    hue_a, light_a, saturation_a = _hls(one)
    hue_b, light_b, saturation_b = _hls(other)
    if saturation_a > CHROMATIC and saturation_b > CHROMATIC:
        apart = abs(hue_a - hue_b) * 360
        return min(apart, 360 - apart) < HUE_APART
    if saturation_a <= CHROMATIC and saturation_b <= CHROMATIC:
        return abs(light_a - light_b) < LIGHTNESS_APART
    return False  # a hue beside a grey: told apart


def test_the_check_tells_the_old_clash_and_a_real_difference():
    assert share_a_hue(style.VERMILLION, style.ORANGE)  # the orange that was CP, activations and n=1
    assert share_a_hue(style.GREY, "#A0A0A0") and not share_a_hue(style.GREY, style.BLACK)
    assert not share_a_hue(style.BLUE, style.VERMILLION) and not share_a_hue(style.GREY, style.BLUE)


def test_a_role_a_memory_category_and_a_setting_never_share_a_hue():
    clashes = []
    for (family_a, colors_a), (family_b, colors_b) in combinations(FAMILIES.items(), 2):
        for name_a, color_a in colors_a.items():
            for name_b, color_b in colors_b.items():
                if frozenset({(family_a, name_a), (family_b, name_b)}) in SAME_MEANING:
                    assert color_a == color_b  # one meaning, one colour
                elif share_a_hue(color_a, color_b):
                    clashes.append(f"{family_a} {name_a} {color_a} ~ {family_b} {name_b} {color_b}")
    assert clashes == [], "\n".join(clashes)


def _clashes_with_what_it_is_drawn_beside(group: str) -> list[str]:
    colors, beside = DRAWN_WITH[group]
    return [
        f"{group} {name} {color} ~ {family} {key} {other}"
        for name, color in colors.items()
        for family in beside
        for key, other in FAMILIES[family].items()
        if share_a_hue(color, other)
    ]


def test_a_verdict_takes_no_hue_of_the_bars_it_marks_and_says_itself_by_shape():
    clashes = _clashes_with_what_it_is_drawn_beside("verdict")
    assert clashes == [], "\n".join(clashes)
    colors, _ = DRAWN_WITH["verdict"]
    assert all(_hls(color)[2] <= CHROMATIC for color in colors.values())  # neutral: no hue to be read as a category
    assert style.VERDICT_SYMBOLS[True] != style.VERDICT_SYMBOLS[False]  # the shape tells fits from does not fit


def test_a_layer_state_that_is_no_roles_shares_no_colour_with_a_category_or_a_role():
    clashes = _clashes_with_what_it_is_drawn_beside("state")
    assert clashes == [], "\n".join(clashes)
    # The states that are a role's say it in the role's colour.
    assert (style.STATE_COLORS["held"], style.STATE_COLORS["recomputing"]) == (
        style.ROLE_COLORS["keep"],
        style.ROLE_COLORS["rerun"],
    )


def test_a_phase_is_a_neutral_wash_lighter_than_anything_drawn_with_it():
    colors, beside = DRAWN_WITH["phase"]
    assert set(colors) == {"forward", "loss", "backward", "optimizer"}
    assert all(_hls(color)[2] <= CHROMATIC for color in colors.values())  # no hue: none of a category's or role's
    neutrals = [
        (f"{family} {key}", other)
        for family in beside
        for key, other in FAMILIES[family].items()
        if _hls(other)[2] <= CHROMATIC
    ]
    assert ("category other", style.PALE_GREY) in neutrals  # the palest neutral beside them was found
    too_dark = [
        f"phase {name} {color} not lighter than {what} {other}"
        for name, color in colors.items()
        for what, other in neutrals
        if _hls(color)[1] <= _hls(other)[1]
    ]
    assert too_dark == [], "\n".join(too_dark)
    order = list(colors)  # the step's order: each phase told from the next by lightness
    assert all(_hls(colors[a])[1] != _hls(colors[b])[1] for a, b in pairwise(order))
    assert len(set(colors.values())) == len(colors)
    assert {**colors, "rerun": style.ROLE_COLORS["rerun"]} == style.BAND_COLORS  # the timeline shades with these
    # Its grid shows over every wash: darker than the darkest of them (GRID was the backward's own wash).
    assert _hls(style.WASH_GRID)[1] < min(_hls(color)[1] for color in colors.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_within_a_family_each_meaning_has_its_own_colour(family):
    colors = FAMILIES[family]
    clashes = [
        f"{name_a} {colors[name_a]} ~ {name_b} {colors[name_b]}"
        for name_a, name_b in combinations(colors, 2)
        if frozenset({name_a, name_b}) not in MERGED and colors[name_a] == colors[name_b]
    ]
    assert clashes == []


def test_the_roles_hatches_and_the_layer_states_follow_the_roles():
    for role, color in style.ROLE_COLORS.items():
        assert style.HATCH_COLORS[role] == style.tint(color, 0.25)
    assert style.STATE_COLORS["held"] == style.ROLE_COLORS["keep"]
    assert style.STATE_COLORS["input_only"] == style.ROLE_COLORS["CP"]
    assert style.STATE_COLORS["recomputing"] == style.ROLE_COLORS["rerun"] == style.BAND_COLORS["rerun"]
    assert (style.SETTING_COLORS["off"], style.SETTING_COLORS["full"]) == (style.OFF_COLOR, style.RUN_COLOR)
    assert not share_a_hue(style.NOISE_GREY, style.OFF_COLOR)  # a noisy bar is not read as checkpointing off


def test_tint_moves_a_colour_toward_white():
    assert style.tint("#000000", 0.5) == "#808080"
    assert style.tint(style.BLUE, 0.0) == style.BLUE and style.tint(style.BLUE, 1.0) == "#FFFFFF"


def test_the_figures_take_their_colours_from_the_style_module():
    literals = [
        f"{path.relative_to(FIGURES.parents[2])}:{number} {line.strip()}"
        for path in sorted(FIGURES.glob("*.py"))
        if path.name != "_style.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HEX.search(line)
    ]
    assert literals == [], "\n".join(literals)
    assert len(list(FIGURES.glob("*.py"))) > 5  # the figures were found
