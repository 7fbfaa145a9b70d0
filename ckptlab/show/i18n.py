"""The lab's words in English, Portuguese (pt-BR) and Japanese, read from ``ckptlab/locales/<lang>.json``.

The files are package data: they install with ckptlab (``pip install .``), so an installed lab has its texts.

Every user-facing string of the pages lives in those files under a dotted key; code asks
for ``t(key, lang, **values)``, the one way pages, ``lab/`` and figures get words (``tests/show/test_one_translation.py``
scans for any other). The language is an argument, never a global: the page
layer reads it from the URL (``?lang=ja``) and passes it in, so this module stays free of
streamlit and the core can translate figure titles too.

Technical terms practitioners say in English (every_n_layers, offload, checkpoint, CP,
keep, rerun) stay in English in every file.
"""

from __future__ import annotations

import json
import string
from functools import cache
from pathlib import Path

from ..message import Message

LOCALES_DIR = Path(__file__).resolve().parents[1] / "locales"  # ckptlab/locales, beside the package's modules
DEFAULT = "en"
# Language code -> its own name, as the selector shows it (a person looks for their language in it).
LANGUAGES: dict[str, str] = {"en": "English", "pt-BR": "Português (Brasil)", "ja": "日本語"}


class MissingKeyError(KeyError):
    """A key asked for is in no locale file: a typo in code, or a string not yet added."""


def normalize(lang: object) -> str:
    """A supported language code for anything a URL may hold ("ja", "pt-br", "pt", None, a list...).

    Unknown values fall back to English rather than failing: a shared link must always open.
    """
    if isinstance(lang, (list, tuple)):
        lang = lang[-1] if lang else None
    if not isinstance(lang, str):
        return DEFAULT
    text = lang.strip().lower().replace("_", "-")
    for code in LANGUAGES:
        if text == code.lower():
            return code
    if text.startswith("pt"):
        return "pt-BR"
    if text.startswith("ja"):
        return "ja"
    return DEFAULT


@cache
def messages(lang: str) -> dict[str, str]:
    """The flat key -> text table of one language.

    Raises:
        FileNotFoundError: the language has no file in ``ckptlab/locales/``.
    """
    with open(LOCALES_DIR / f"{lang}.json", encoding="utf-8") as handle:
        return json.load(handle)


def t(key: str, lang: str = DEFAULT, /, **values: object) -> str:
    """The text of ``key`` in ``lang``, with ``{name}`` placeholders filled from ``values``.

    A key missing in one language falls back to English (the locale tests keep that from
    happening); a key missing in English is a bug and raises.

    Raises:
        MissingKeyError: ``key`` is not in the English file.
    """
    table = messages(normalize(lang))
    text = table.get(key)
    if text is None:
        text = messages(DEFAULT).get(key)
        if text is None:
            raise MissingKeyError(
                f"translation key {key!r} is not in ckptlab/locales/{DEFAULT}.json; add it to every locale file"
            )
    return text.format(**values) if values else text


def placeholders(text: str) -> set[str]:
    """The ``{name}`` fields of a message, to check every translation keeps them all."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


ERRORS = "errors."  # the prefix of the translations of keyed core errors (ckptlab.errors)


def error_text(error: Exception, lang: str = DEFAULT) -> str:
    """What the app shows for ``error`` in ``lang``: its ``errors.<key>`` translation, or its English message.

    English is the core's own message (written where the error is raised), so ``en.json``
    has no ``errors.`` keys; the other languages translate the keyed ones, filled in with
    the error's params. An error without a key, or a key without a translation yet,
    shows its English message rather than nothing.
    """
    return _translated(ERRORS, getattr(error, "key", None), getattr(error, "params", {}), str(error), lang)


SAID = "said."  # the prefix of the translations of the core's other sentences (ckptlab.message.Message)
CORE_PREFIXES = (ERRORS, SAID)  # keys whose English is the core's own, so en.json has none


def say(message: str, lang: str = DEFAULT) -> str:
    """A core sentence in ``lang``: a :class:`Message`'s ``said.<key>`` translation filled with its params;
    its English otherwise, and a plain string (a note read back from JSON, say) as it is.

    As with :func:`error_text`, ``en.json`` has no ``said.`` keys: the English is the core's own.
    A param that is a Message itself (a progress line's prefix, say) is said in ``lang`` too, and so on down.
    """
    if not isinstance(message, Message):
        return str(message)
    params = {name: say(value, lang) if isinstance(value, Message) else value for name, value in message.params.items()}
    return _translated(SAID, message.key, params, message.text, lang)


def _translated(prefix: str, key: str | None, params: dict, english: str, lang: str) -> str:
    """The one lookup of the core's words: ``prefix + key`` in ``lang`` filled with ``params``, else the English."""
    code = normalize(lang)
    text = None if key is None or code == DEFAULT else messages(code).get(prefix + key)
    return english if text is None else text.format(**params)


def say_all(messages: tuple[Message, ...] | list[Message], lang: str = DEFAULT) -> str:
    """Several core sentences in ``lang``, as one paragraph."""
    return " ".join(say(message, lang) for message in messages)
