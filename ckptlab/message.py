"""A sentence the core says: its English words, and the key and params an edge translates it by.

The same split as :class:`ckptlab.errors.CkptlabError`: the English is written where it is
said (the command line prints it as it is; gettext keeps its source texts in the source too),
and the app looks ``said.<key>`` up in its language's locale file and fills in the params
(:func:`ckptlab.show.i18n.say`). So a page never shows the core's English in pt-BR or ja,
and never decides anything on the words: the key and the params are the typed part.

A :class:`Message` is a ``str`` (its English), so a result's ``notes`` stay a list of strings
for JSON, the command line and code that reads them; a note read back from JSON is plain
English again, and a page shows that as it is.
"""

from __future__ import annotations

from typing import Any


class Message(str):
    """One sentence: the ``str`` is its English, ``key`` its name under ``said.``, ``params`` what it fills in."""

    key: str
    params: dict[str, Any]

    def __new__(cls, text: str, key: str, params: dict[str, Any] | None = None) -> Message:
        message = super().__new__(cls, text)
        message.key = key
        message.params = dict(params or {})
        return message

    def __reduce__(self) -> tuple[type[Message], tuple[str, str, dict[str, Any]]]:  # copy and pickle keep the key
        return (Message, (str(self), self.key, self.params))

    @property
    def text(self) -> str:
        """The English, as a plain string."""
        return str(self)


def joined(messages: tuple[Message, ...] | list[Message]) -> str:
    """The English of several sentences, as one paragraph."""
    return " ".join(message.text for message in messages)
