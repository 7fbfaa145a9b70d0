"""A sentence the core says: its English words, and the key and params an edge translates it by.

The same split as :class:`ckptlab.errors.CkptlabError`: the English is written where it is
said (the command line prints it as it is; gettext keeps its source texts in the source too),
and the app looks ``said.<key>`` up in its language's locale file and fills in the params
(:func:`ckptlab.show.i18n.say`). So a page never shows the core's English in pt-BR or ja,
and never decides anything on the words: the key and the params are the typed part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Message:
    """One sentence: ``text`` in English, ``key`` under ``said.`` in the locale files, ``params`` it fills in."""

    text: str
    key: str
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


def joined(messages: tuple[Message, ...] | list[Message]) -> str:
    """The English of several sentences, as one paragraph."""
    return " ".join(message.text for message in messages)
