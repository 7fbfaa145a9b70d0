"""Trainer's side of the step in the pages' widgets and links: gradient accumulation, mixed precision, clipping,
and the attention the model is built with (a model keyword, not a TrainingArguments field, drawn in the same box).

The Lab, Trade-offs and At-scale pages draw the same three boxes (``pages._common.step_boxes``) under
their own prefix (``lab_accumulation``, ``tradeoffs_mixed_precision``, ...); these functions turn a
spec into those widgets' values, the values back into ``RunSpec`` fields, and the values into the
link's keys (``accum=4&mp=bf16&clip=0.5``, read back by :func:`ckptlab.lab.query.spec_from_query`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..spec import RunSpec
from ..spec_fields import FIELD, SpecField, drawn_by

_DEFAULTS = RunSpec()

_STEP = drawn_by("step_boxes")  # the fields whose widgets are in the step box (spec_fields.Widget.drawn_by)
# The widget's name after the page's prefix -> the RunSpec field it sets.
FIELDS = {field.widget.name: field.name for field in _STEP if field.widget is not None}
# The RunSpec field -> its key in a link.
QUERY_KEYS = {field.name: field.link.key for field in _STEP if field.link is not None}


def widget_key(prefix: str, field: SpecField) -> str:
    """The session-state key of ``field``'s widget on a page: ``<prefix>_<widget name>`` (``lab_seq``)."""
    assert field.widget is not None, field.name
    return f"{prefix}_{field.widget.name}"


def widget_values(prefix: str, spec: RunSpec, fields: Sequence[SpecField]) -> dict[str, Any]:
    """The session-state values of ``fields``' widgets for ``spec`` (a field's ``never`` as its box's top)."""
    return {widget_key(prefix, field): to_widget(field, getattr(spec, field.name)) for field in fields}


def to_widget(field: SpecField, value: Any) -> Any:
    """A field's value as its widget holds it: a number box cannot hold the field's ``never`` (max_grad_norm's inf,
    never clip), so it shows its top, which :func:`from_widget` reads back as ``never``."""
    if field.never is not None and value == field.never:
        return field.offered
    return value


def widget_fields(prefix: str, values: Mapping[str, Any], fields: Sequence[SpecField]) -> dict[str, Any]:
    """The ``RunSpec`` fields ``fields``' widgets say (every widget drawn)."""
    return {field.name: from_widget(field, values[widget_key(prefix, field)]) for field in fields}


def from_widget(field: SpecField, value: Any) -> Any:
    """A widget's value as its field's: a number box's as the type of the field's default (a whole number or not), its
    top as the field's ``never`` where it has one (spec_fields.SpecField.never)."""
    if field.widget is not None and field.widget.kind == "number":
        if field.never is not None and value == field.offered:
            return field.never
        return type(getattr(_DEFAULTS, field.name))(value)
    return value


def step_widget_values(prefix: str, spec: RunSpec) -> dict[str, Any]:
    """The session-state values of the page's step boxes for ``spec``."""
    return widget_values(prefix, spec, _STEP)


def step_fields(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RunSpec`` fields the page's step boxes say (defaults where a box is not drawn); a number box's value as
    the type of the field's default (a whole number or not)."""
    return {
        field: from_widget(FIELD[field], values.get(f"{prefix}_{name}", getattr(_DEFAULTS, field)))
        for name, field in FIELDS.items()
    }


def step_query(fields: Mapping[str, Any]) -> dict[str, str]:
    """The link's keys for the step's fields that differ from the lab's defaults (a default needs no key)."""
    defaults = RunSpec()
    return {
        QUERY_KEYS[field]: f"{value:g}" if isinstance(value, float) else str(value)
        for field, value in fields.items()
        if field in QUERY_KEYS and value != getattr(defaults, field)
    }
