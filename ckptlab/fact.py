"""What the core says happened, as typed facts, and the one lookup that words a fact in a language.

A :class:`Fact` is a key and the values it names (a run's layer count, a setting's key, the bytes
offload moved): what happened, never how to say it. Its words live in ``ckptlab/locales/<lang>.json``
under ``said.<key>``, English included, so the command line, the JSON a result writes and every page
say a fact through :func:`worded` from the same files. Code decides on a fact's key and params,
never on its sentence.

This module sits in the bottom layer so the results layer can write a result's notes in English
(``RunResult.to_dict``); the edge asks :func:`ckptlab.show.i18n.say`, which normalizes the language.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

LOCALES_DIR = Path(__file__).resolve().parent / "locales"  # package data: installs with ckptlab
ENGLISH = "en"
SAID = "said."  # the prefix of a fact's words in every locale file
# A language's decimal mark and thousands separator, in that order (plotly's ``layout.separators`` reads the same):
# ".," in English and Japanese, ",." in Brazilian Portuguese. Language data, so it lives in the locale files.
SEPARATORS = "number.separators"
# A value a one-line message shows whole up to this many characters; a longer one (a 5,000-character flag, 20,000
# characters of names, a link's 5,000 digits) as its first CUT_AT characters and its length (:func:`cut_for_message`).
CUT_AT = 200


class MissingKeyError(KeyError):
    """A key asked for is in no locale file: a typo in code, or a string not yet added."""


@dataclass(frozen=True)
class Fact:
    """One thing the core says: ``key`` names it (``said.<key>`` in the locale files), ``params`` its values.

    A param may be a Fact itself (a progress line's prefix): it is worded in the same language; or a tuple
    of facts (a mismatch's rows): each worded, then joined by the language's ``said.list_separator``.
    """

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:  # params is a dict: equal facts have the same key and param names
        return hash((self.key, tuple(sorted(self.params))))

    def to_dict(self) -> dict[str, Any]:
        """``{"key": ..., "params": {...}}``, nested facts as dicts too, for JSON."""
        return {"key": self.key, "params": {name: _as_data(value) for name, value in self.params.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fact:
        """The fact :meth:`to_dict` wrote."""
        params = data.get("params", {})
        return cls(data["key"], {name: _fact_or_value(value) for name, value in params.items()})


def _as_data(value: Any) -> Any:
    if isinstance(value, Fact):
        return value.to_dict()
    return [one.to_dict() for one in value] if _facts(value) else value


def _fact_or_value(value: Any) -> Any:
    if isinstance(value, list) and value and all(_is_fact_data(one) for one in value):
        return tuple(Fact.from_dict(one) for one in value)
    return Fact.from_dict(value) if _is_fact_data(value) else value


def _is_fact_data(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"key", "params"}


def _facts(value: Any) -> bool:
    """``value`` is a tuple of facts (a param worded as a list)."""
    return isinstance(value, tuple) and bool(value) and all(isinstance(one, Fact) for one in value)


@cache
def messages(lang: str) -> dict[str, str]:
    """The flat key -> text table of one language.

    Raises:
        FileNotFoundError: the language has no file in ``ckptlab/locales/``.
    """
    with open(LOCALES_DIR / f"{lang}.json", encoding="utf-8") as handle:
        return json.load(handle)


def text(key: str, lang: str = ENGLISH) -> str:
    """The one lookup of the locale files: ``key``'s text in ``lang`` (a supported code), the English where
    ``lang`` has no such key yet. A fact's words (``said.``), an error's (``errors.``) and a page's (``t``) all
    come through here.

    Raises:
        MissingKeyError: ``key`` is not in the English file.
    """
    found = messages(lang).get(key) or messages(ENGLISH).get(key)
    if found is None:
        raise MissingKeyError(f"{key!r} is not in ckptlab/locales/{ENGLISH}.json; add it to every locale file")
    return found


def worded(fact: Fact, lang: str = ENGLISH) -> str:
    """``fact`` in ``lang`` (a supported code): its ``said.<key>`` text filled with its params, nested facts
    worded in ``lang`` too; the English where ``lang`` has no such key yet.

    Raises:
        MissingKeyError: ``said.<key>`` is not in the English file.
    """
    return filled(
        text(SAID + fact.key, lang), lang, {name: worded_param(value, lang) for name, value in fact.params.items()}
    )


def separators(lang: str) -> str:
    """``lang``'s decimal mark and thousands separator (``".,"`` or ``",."``): :data:`SEPARATORS` of its file."""
    return messages(lang).get(SEPARATORS) or messages(ENGLISH)[SEPARATORS]


def localized(text: str, lang: str) -> str:
    """A number Python formatted (``"1,234.5"``, ``"+22.0%"``) with ``lang``'s decimal mark and thousands separator
    (``"1.234,5"`` in pt-BR): the one place a number shown to people takes its language's form."""
    marks = separators(lang)
    return text if marks == ".," else text.translate(str.maketrans(".,", marks))


def number(value: float, spec: str, lang: str) -> str:
    """``format(value, spec)`` in ``lang``'s form: ``number(75.3, ",.1f", "pt-BR") == "75,3"``."""
    return localized(format(value, spec), lang)


# The unit format specs a template may put on a number of bytes or a count: ``{needed:gib}`` is ``needed`` (bytes)
# as GiB with one decimal in the reader's language. A fact or an error carries the bytes; the template picks the
# unit, so no sentence's number is formatted in the core (issue 57). The divisors are ckptlab.units' constants,
# which registers them here (units imports this module, so this module cannot import it): name -> (divisor, spec).
UNIT_SPECS: dict[str, tuple[float, str]] = {}


class _NumberFormatter(string.Formatter):
    """``str.format`` but that a number formatted in a template (``{peak:,.1f}``) takes the language's form, and a
    unit spec of :data:`UNIT_SPECS` (``{needed:gib}``) divides the number first."""

    def __init__(self, lang: str) -> None:
        self.lang = lang

    def format_field(self, value: Any, format_spec: str) -> str:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if format_spec in UNIT_SPECS and is_number:
            divisor, format_spec = UNIT_SPECS[format_spec]
            value = value / divisor
        try:
            text = format(value, format_spec)
        except (ValueError, TypeError):  # a spec for a number met a text: a message is said, never raised from
            return str(value)
        return localized(text, self.lang) if is_number else text


def filled(text: str, lang: str, values: Mapping[str, Any]) -> str:
    """``text.format(**values)``, its numbers in ``lang``'s form (:func:`localized`) and unit specs applied."""
    return _NumberFormatter(lang).vformat(text, (), values)


def worded_param(value: Any, lang: str) -> Any:
    """A param as a sentence fills it in ``lang``: a fact worded, a tuple of facts worded and joined by the
    language's ``said.list_separator``, anything else as it is, cut where it is long (:func:`cut_for_message`)."""
    if isinstance(value, Fact):
        return worded(value, lang)
    if _facts(value):
        return worded(Fact("list_separator"), lang).join(worded(one, lang) for one in value)
    return cut_for_message(value, lang)


class CutValue(str):
    """A long value as a message shows it: its start and its length in the reader's words (``said.cut_value``). Its
    ``repr`` (a template's ``{value!r}``, an option's ``field=value``) quotes the start alone where the value was a
    text: ``'xxxx'… (5,000 characters)``."""

    quoted: str

    def __new__(cls, value: Any, lang: str) -> CutValue:
        whole = value if isinstance(value, str) else repr(value)
        start = whole[:CUT_AT]
        shown = repr(start) if isinstance(value, str) else start
        plain, quoted = (Fact("cut_value", {"start": one, "characters": len(whole)}) for one in (start, shown))
        # Filled here, not through worded(): its start is a param that must not be cut again.
        said = super().__new__(cls, filled(text(SAID + plain.key, lang), lang, plain.params))
        said.quoted = filled(text(SAID + quoted.key, lang), lang, quoted.params)
        return said

    def __repr__(self) -> str:
        return self.quoted


def cut_for_message(value: Any, lang: str = ENGLISH) -> Any:
    """``value`` as a one-line message shows it: whole up to :data:`CUT_AT` characters, else a :class:`CutValue`
    (its first characters and its length). A text, or a list or tuple of values (by its repr); anything else (a
    number, a path object) as it is. The one cut of a value for a message: errors' params, their options' values
    (``ckptlab.errors``) and facts' params all pass through it."""
    if isinstance(value, CutValue):
        return value
    if isinstance(value, str):
        long = len(value) > CUT_AT
    elif isinstance(value, (list, tuple)):
        long = len(value) > CUT_AT or len(repr(value)) > CUT_AT
    else:
        return value
    return CutValue(value, lang) if long else value
