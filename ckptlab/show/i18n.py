"""The lab's words in English, Portuguese (pt-BR) and Japanese, read from ``ckptlab/locales/<lang>.json``.

The files are package data: they install with ckptlab (``pip install .``), so an installed lab has its texts.

Every user-facing string of the pages lives in those files under a dotted key; code asks
for ``t(key, lang, **values)``, the one way pages, ``lab/`` and figures get words (``tests/show/test_one_translation.py``
scans for any other), and for a fact of the core (:class:`ckptlab.fact.Fact`) ``say(fact, lang)``. The
language is an argument, never a global: the page layer reads it from the URL (``?lang=ja``) and passes it in, so this module stays free of
streamlit and the core can translate figure titles too.

Technical terms practitioners say in English (every_n_layers, offload, checkpoint, CP,
keep, rerun) stay in English in every file.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Callable, Sequence

from ..errors import ERRORS as ERRORS
from ..errors import CkptlabError, Reference
from ..fact import ENGLISH, Fact, filled, worded

# The locale files' lookup lives in ckptlab.fact (the results layer words notes too); the edge asks here.
from ..fact import LOCALES_DIR as LOCALES_DIR
from ..fact import SAID as SAID
from ..fact import MissingKeyError as MissingKeyError
from ..fact import messages as messages
from ..fact import number as number  # a number shown to people, in its language's form
from ..fact import separators as separators
from ..fact import text as lookup

DEFAULT = ENGLISH
# Language code -> its own name, as the selector shows it (a person looks for their language in it).
LANGUAGES: dict[str, str] = {"en": "English", "pt-BR": "Português (Brasil)", "ja": "日本語"}


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


def t(key: str, lang: str = DEFAULT, /, **values: object) -> str:
    """The text of ``key`` in ``lang``, with ``{name}`` placeholders filled from ``values``; a number formatted in
    the template (``{peak:,.1f}``) in the language's form (a caller that formats a number itself asks
    :func:`number`).

    A key missing in one language falls back to English (the locale tests keep that from
    happening); a key missing in English is a bug and raises.

    Raises:
        MissingKeyError: ``key`` is not in the English file.
    """
    code = normalize(lang)
    text = lookup(key, code)
    return filled(text, code, values) if values else text


def placeholders(text: str) -> set[str]:
    """The ``{name}`` fields of a message, to check every translation keeps them all."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def error_text(error: Exception, lang: str = DEFAULT, word: Callable[[Reference], str] = str) -> str:
    """What the app shows for ``error`` in ``lang``: a core error's ``errors.<key>`` words filled with its params,
    English included (``str(error)`` is the same words with the Python API's references). ``word`` says the
    error's options and commands (:class:`ckptlab.errors.Option`) in the reader's words (``ckptlab.show.wording``);
    by default the Python API's. Any other exception (a bug) shows its own message.
    """
    if not isinstance(error, CkptlabError):
        return str(error)
    return error.worded(word, normalize(lang))


def say(fact: Fact | Sequence[Fact], lang: str = DEFAULT) -> str:
    """A core fact in ``lang``'s words (``said.<key>`` filled with its params), English included: the one
    function the pages and the command line word a fact with. Several facts (a recommendation's reasons)
    are one paragraph."""
    if isinstance(fact, Fact):
        return worded(fact, normalize(lang))
    return " ".join(worded(one, normalize(lang)) for one in fact)


# Characters Markdown gives a meaning inside a line (links, images, emphasis, code, HTML, tables), Streamlit's
# extensions too (:red[...] and :emoji: directives, $math$), and the "." of a "www." autolink. A value is one line
# (a control character in a link is refused first), so what only means something at a line's start ("- ", "# ")
# is left as typed: a "no-such-card" reads as typed in the page's source.
_MARKDOWN_SPECIAL = re.compile(r"[\\`*_{}\[\]()<>!|~:$.]")


def markdown_literal(text: str) -> str:
    """``text`` with every character Markdown gives a meaning escaped, so a page shows it as typed: a link's
    ``[click me](https://...)`` stays those characters, never a link nor an image the browser fetches."""
    return _MARKDOWN_SPECIAL.sub(lambda found: "\\" + found.group(0), text)


class Literal(str):
    """A value someone else typed (a link's), shown in Markdown as text: ``{value}`` and ``{value!r}`` in a
    template both come out escaped (:func:`markdown_literal`); the template's own Markdown stays Markdown.

    Pages wrap such values where they show them (:func:`as_text`); ``say`` and ``t`` do not escape, since the
    command line words the same facts for a terminal."""

    __slots__ = ()

    def __format__(self, spec: str) -> str:
        return markdown_literal(format(str(self), spec))

    def __repr__(self) -> str:
        return markdown_literal(str.__repr__(str(self)))


def as_text(fact: Fact) -> Fact:
    """``fact`` with each text param a :class:`Literal`: for a page that shows what a link or a participant gave."""
    return dataclasses.replace(
        fact, params={n: Literal(v) if isinstance(v, str) else v for n, v in fact.params.items()}
    )
