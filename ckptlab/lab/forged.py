"""Which widget values a page's own boxes could have sent, and which were forged over the websocket.

A browser sends each widget's value over Streamlit's websocket, and a person can send anything there: a NaN for a
number box, a number for a select box, a string for a list. Streamlit hands such a value to the page as it came (a
select box's, a text box's) or clamps it to the box's default. The pages read their widgets through
:func:`refused_keys` first, with the checks here (a number box's bounds and a select box's choices from the field's
declaration in :mod:`ckptlab.spec_fields`, the one home of both), so a forged value gets the page's one-line refusal
instead of a stack trace. Nothing here imports streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from ..spec_fields import FIELD

Check = Callable[[object], bool]  # whether a widget could have sent the value
SHOWN_CHARS = 40  # a refused value is named in the refusal, cut to this many characters


def is_number(value: object) -> bool:
    """A finite int or float (a bool is a toggle's, not a number box's)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def text(value: object) -> bool:
    """A text box's value: a string."""
    return isinstance(value, str)


def flag(value: object) -> bool:
    """A toggle's or a check box's value: True or False."""
    return isinstance(value, bool)


def names(value: object) -> bool:
    """A multiselect's value: a list of strings (which of them the model has is the page's own question)."""
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def one_of(options: Iterable[object]) -> Check:
    """A select box's check: one of ``options`` (by value and type: a forged 1.0 is not the option 1)."""
    allowed = [(type(option), option) for option in options]
    return lambda value: (type(value), value) in allowed


def whole_at_least(low: int) -> Check:
    """A slider of whole numbers from ``low`` up (its top is the model's, checked where the page knows it)."""

    def whole(value: object) -> bool:
        return isinstance(value, (int, float)) and is_number(value) and float(value).is_integer() and value >= low

    return whole


def field_check(name: str) -> Check:
    """The check of a RunSpec field's widget, from its declaration: a number box within ``low`` and ``offered``
    (a whole number where the field's default is one), a select box among its choices."""
    field = FIELD[name]
    assert field.widget is not None, name
    if field.widget.kind == "select":
        return one_of(field.choices)
    if field.widget.kind == "number":
        low, high = field.low, field.offered

        def within(value: object) -> bool:
            return (
                isinstance(value, (int, float))
                and is_number(value)
                and (low is None or value >= low)
                and (high is None or value <= high)
            )

        return within
    if field.widget.kind == "toggle":
        return flag
    if field.widget.kind == "multiselect":
        return names
    return whole_at_least(1)  # a slider: every_n_layers


def refused_keys(values: Mapping[str, object], checks: Mapping[str, Check]) -> dict[str, object]:
    """The widget keys in ``values`` whose value their check refuses, with that value; keys absent are not checked
    (the page fills them as on its first run)."""
    return {key: values[key] for key, check in checks.items() if key in values and not check(values[key])}


def shown_value(value: object) -> str:
    """A refused value as a refusal names it: a number as ``401`` or ``1e+18``, anything else its ``repr``, cut to
    :data:`SHOWN_CHARS` characters."""
    shown = f"{value:g}" if isinstance(value, float) else repr(value)
    return shown if len(shown) <= SHOWN_CHARS else shown[: SHOWN_CHARS - 1] + "…"
