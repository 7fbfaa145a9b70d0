"""Which cases a parametrized exactness test runs: each structurally different model once, each option once.

An option (an optimizer, accumulation, mixed precision, LoRA) changes the step the same way on every model, and
a model's structure (dense, GPT-2's Conv1D, BERT's encoder, MoE) shows with any option: so every model runs
with the base option and every other option runs on one model, in turn, rather than every model with every
option (the product cost five times as much and proved the same behaviours, issue 42).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def covering(models: Sequence[str], options: Sequence[T]) -> list[tuple[str, T]]:
    """``(model, option)`` pairs: every model with ``options[0]``, then each other option on the next model in
    turn (so each also meets a model other than the first). pytest names a case "model-option"."""
    pairs = [(model, options[0]) for model in models]
    return pairs + [(models[(index + 1) % len(models)], option) for index, option in enumerate(options[1:])]
