"""Trainer's side of the step in the pages' widgets: gradient accumulation, mixed precision, clipping, and the
attention the model is built with (a model keyword, not a TrainingArguments field, drawn in the same box).

The Lab, Trade-offs and At-scale pages draw the same box (``pages._common.step_boxes``) under their own prefix
(``lab_accumulation``, ``tradeoffs_mixed_precision``, ...). Its fields are those declared ``drawn_by="step_boxes"``
(``ckptlab.spec_fields``), coded by the one widget codec (:mod:`ckptlab.lab.widgets`) and written in a link by the one
writer (:func:`ckptlab.lab.query.spec_to_query`); these functions are that codec for the box alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..spec import RunSpec
from .widgets import PageWidgets


def step_widget_values(prefix: str, spec: RunSpec) -> dict[str, Any]:
    """The session-state values of the page's step box for ``spec``."""
    return PageWidgets(prefix, ()).values(spec)


def step_fields(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RunSpec`` fields the page's step box says (defaults where it is not drawn)."""
    return PageWidgets(prefix, ()).fields(values)
