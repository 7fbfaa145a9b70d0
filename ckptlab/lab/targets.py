"""LoRA's targets as the pages offer them: a model's projections, all of them unless a link or a person chose some.

The Lab and At-scale pages keep the chosen names and the model they were chosen for in the
session; these functions decide what the boxes hold when the model changes, and which
targets a spec gets. Nothing here imports streamlit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Targets:
    """What the targets box holds for a model, and the asked-for names that model does not have."""

    chosen: list[str]  # the names to show as chosen
    unknown: list[str]  # names asked for (a link's) that the model does not have; empty when none


def settle(chosen: Sequence[str], choices: Sequence[str], chosen_for: str | None, model: str) -> Targets:
    """The targets for ``model`` given what was chosen before, and for which model.

    Args:
        chosen: the names in the box now.
        choices: the projections LoRA can adapt in ``model`` (empty: LoRA does not apply).
        chosen_for: the model ``chosen`` was picked for; None when a link asked for "all".
        model: the model now.

    Returns:
        For another model (or "all" from a link): the chosen names that carry over, or all of
        ``choices``. For the same model: the chosen names it has (all of them if none), and
        the ones it does not have as ``unknown``.
    """
    kept = [name for name in chosen if name in choices]
    if chosen_for != model:
        return Targets(kept if kept and chosen_for is not None else list(choices), [])
    if len(kept) < len(chosen):
        return Targets(kept or list(choices), [name for name in chosen if name not in choices])
    return Targets(list(chosen), [])


def spec_targets(chosen: Sequence[str], choices: Sequence[str], lora: bool) -> tuple[str, ...] | None:
    """The spec's ``lora_targets``: the chosen names in the model's order, or None for "all of them" (or no LoRA)."""
    if lora and set(chosen) != set(choices):
        return tuple(name for name in choices if name in chosen)
    return None
