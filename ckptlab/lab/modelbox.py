"""The model box the Lab, At-scale and Trade-offs pages share: its entries, their labels and captions, one duration.

One home (issue 57): the two sentinel entries beside the presets (a folder the instructor offers, a Hub name), a
preset's label and caption, a Hub name's problem, and how a wait or an estimate in seconds is said. The pages draw
the box; what it says comes from here, so a preset reads the same on every page.
"""

from __future__ import annotations

import os

from ..model import hub
from ..model.catalog import ModelInfo
from ..show import i18n
from ..show.i18n import t
from ..units import parameter_count

LOCAL = "local"  # the box's entry for a folder the instructor offers
HUB = "hub"  # the box's entry for a Hub repository, where the instructor allows them (CKPTLAB_HUB=1)
SENTINELS = (LOCAL, HUB)


def params_label(num_params: int, lang: str) -> str:
    """A parameter count as every page and message says it (``units.parameter_count``): "1.54B", "135.0M"."""
    return i18n.say(parameter_count(num_params), lang)


def model_label(name: str, info: ModelInfo | None, lang: str, *, grouped: bool = False) -> str:
    """An entry of the box: a preset's name, layers and size (``grouped``: after its group, tiny or real, as the Lab
    page sorts them); the folder and Hub entries in words."""
    if name == HUB:
        return t("lab.hub_entry", lang)
    if name == LOCAL or info is None:
        return t("lab.local_dir", lang)
    size = params_label(info.num_params, lang)
    if not grouped:
        return t("at_scale.model_label", lang, name=name, layers=info.num_layers, size=size)
    group = t("lab.group_tiny", lang) if info.cpu_ok else t("lab.group_real", lang)
    return t("lab.model_label", lang, group=group, name=name, layers=info.num_layers, size=size)


def model_caption(info: ModelInfo, lang: str) -> str:
    """The line under the box: family, layers, hidden size and positions (∞ when the config says none)."""
    positions = i18n.number(info.max_positions, ",", lang) if info.max_positions else "∞"
    return t(
        "at_scale.model_caption",
        lang,
        family=info.family,
        layers=info.num_layers,
        hidden=info.hidden_size,
        positions=positions,
    )


def hub_name_problem(name: str, lang: str) -> str:
    """Why the Hub box's ``name`` is not fetched ("" when it is): it must read as ``owner/name`` and be no folder of
    the server's (the box must not open, by another name, a folder the instructor does not offer)."""
    if hub.is_repo_name(name) and not os.path.exists(name):
        return ""
    return t("lab.hub_not_a_name", lang, name=repr(i18n.Literal(name)))  # typed or linked: shown as text


def duration(seconds: float, lang: str) -> str:
    """A wait or an estimate in the unit that reads best: whole seconds under two minutes, then minutes, then hours
    with one decimal ("45 s", "2.5 min", "2.5 h")."""
    if seconds < 120:
        return f"{i18n.number(seconds, ',.0f', lang)} s"
    if seconds < 7200:
        return f"{i18n.number(seconds / 60, ',.1f', lang)} min"
    return f"{i18n.number(seconds / 3600, ',.1f', lang)} h"
