"""Exceptions the lab raises for input it cannot run.

Every message names the offending value and says how to fix it, in the spirit of
``torch.utils.checkpoint``'s "To resolve this error, ...". Front ends catch
``CkptlabError`` and show its message; anything else is a bug.

An error is a key and its params, never a sentence: its words, English included, are ``errors.<key>`` in
``ckptlab/locales/<lang>.json``, a ``str.format`` template over the params, looked up through the one lookup of
the locale files (:func:`ckptlab.fact.text`). ``str(error)`` is the English; the app says the same error in
its language (``ckptlab.show.i18n.error_text``) from the same params. So the core never needs to know the
reader's language. A library's own text (an exception's, a path) travels as a param, never inside a key's text;
a part of a sentence that is words of the lab's own (why a bound exists) is a :class:`ckptlab.fact.Fact`
param, worded in the reader's language too.

Nor where it is read. A message that names a setting the reader chose, or a command to run
instead, names it as a typed reference among its params (:class:`Option`, :class:`Command`),
never as the command line's flag nor a widget's name: the core does not know the CLI nor the
app (ARCHITECTURE.md). ``str(error)`` fills the references with the Python API's words
(``every_n_layers=0``, ``offload=True``, ``ckptlab.simulate(RunSpec(model='x'))``), which is how a
Python user has always read it; each edge fills them with its own (``ckptlab.show.wording``: flags
for the CLI, widgets for the app) through :meth:`CkptlabError.worded`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from .fact import ENGLISH, Fact, cut_for_message, filled, text, worded_param

ERRORS = "errors."  # the prefix of an error's words in every locale file


def one_line(text: object, limit: int = 400) -> str:
    """``text`` with its whitespace (newlines, tabs) folded to single spaces, ANSI bold dropped, cut at ``limit``:
    how a library's own text travels as a param of a one-line message."""
    flat = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text)).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


class _Unset:
    """The value of an :class:`Option` that names a setting without a value (``lora_rank``, not ``lora_rank=8``)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"  # pickled as the module's one instance, so ``value is UNSET`` holds in a worker's error


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Option:
    """A setting the reader sets, named by its ``RunSpec`` field (``every_n_layers``, ``offload``, ``model``, ...).

    ``value`` is the value the message is about (``Option("every_n_layers", 0)``), or :data:`UNSET` for the
    setting itself (``Option("lora_rank")``). Checkpointing off is ``Option("every_n_layers", None)``: the
    command line has its own flag for it, the app its own toggle.

    ``str()`` is the Python API's words: ``field=value!r``, or the field alone. ``words`` replaces them where a
    sentence reads better in plain English for a Python user and has always read so ("with checkpointing
    off" rather than "with every_n_layers=None"); the edges word the option from its field and value,
    never from ``words``.
    """

    field: str
    value: Any = UNSET
    words: str | None = None

    def __str__(self) -> str:
        if self.words is not None:
            return self.words
        return self.field if self.value is UNSET else f"{self.field}={self.value!r}"


# Checkpointing off where a sentence says it so in plain words ("offload=True with checkpointing off"); the
# CLI says --no-checkpointing, the app its toggle, off.
CHECKPOINTING_OFF = Option("every_n_layers", None, words="checkpointing off")

# What a Command's action is called in Python: the public function that does it.
PYTHON_CALLS = {"simulate": "ckptlab.simulate", "measure": "ckptlab.measure"}


@dataclass(frozen=True)
class Command:
    """Something to run instead, with the settings that matter: ``Command("simulate", (Option("model", "x"),))``.

    ``action`` is ``"simulate"`` (fake tensors, no GPU) or ``"measure"`` (a real step; with a ``world_size``
    option above 1, that many ranks started by torch's launcher). Each edge says it its own way: the CLI as
    the command line, the app as the page that does it, Python (``str()``) as the function to call.
    """

    action: str
    options: tuple[Option, ...] = ()

    @property
    def ranks(self) -> int:
        """The ranks it launches: its ``world_size`` option, else 1."""
        return next((int(o.value) for o in self.options if o.field == "world_size" and o.value is not UNSET), 1)

    def __str__(self) -> str:
        spec = f"RunSpec({', '.join(map(str, self.options))})"
        if self.action == "measure" and self.ranks > 1:
            return f"ckptlab.step.fsdp.measure_ranks({spec}) in {self.ranks} processes started by torchrun"
        return f"{PYTHON_CALLS[self.action]}({spec})"


Reference = Option | Command


class CkptlabError(Exception):
    """Base class: a request the lab cannot carry out, with a message fit for a user.

    Args:
        key: its words' key under ``errors.`` in the locale files (``"spec.at_most"``).
        params: the values its words fill in: references (:class:`Option`, :class:`Command`) worded by the edge
            that reads it, facts (:class:`ckptlab.fact.Fact`) and errors (the reason for this one) worded in the
            reader's language, anything else formatted as it is (``{value!r}``, ``{limit:,}`` in the words).

    Raises:
        ckptlab.fact.MissingKeyError: ``errors.<key>`` is not in ``en.json``.
    """

    def __init__(self, *, key: str, **params: Any) -> None:
        self.key = key
        self.params = params
        super().__init__(self.worded())

    def worded(self, word: Callable[[Reference], str] = str, lang: str = ENGLISH) -> str:
        """The message in ``lang`` (a supported code), each reference in ``word``'s words (``str``: the Python
        API's), each fact in ``lang``'s."""
        return filled(text(ERRORS + self.key, lang), lang, worded_params(self.params, word, lang))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole, whatever a subclass's __init__ takes: an error raised in a worker process
        # (ckptlab.lab.workers) crosses back with its key and params, so a page still says it in its language
        # and words its options as its widgets.
        return (_rebuilt, (type(self), self.key, self.params), dict(self.__dict__))


def worded_params(params: dict[str, Any], word: Callable[[Reference], str], lang: str = ENGLISH) -> dict[str, Any]:
    """``params`` as a sentence fills them: each :class:`Option` and :class:`Command` in ``word``'s words, each
    fact and each error (the reason for another) in ``lang``'s, the rest as they are."""
    return {name: _worded(value, word, lang) for name, value in params.items()}


def _worded(value: Any, word: Callable[[Reference], str], lang: str) -> Any:
    if isinstance(value, Option) and value.value is not UNSET:
        # The value a reader gave, cut where it is long (a 5,000-character --attn-implementation), worded by the edge.
        return word(replace(value, value=cut_for_message(value.value, lang)))
    if isinstance(value, Reference):
        return word(value)
    if isinstance(value, CkptlabError):  # an error that is the reason for this one, said in the same words
        return value.worded(word, lang)
    return worded_param(value, lang)


def _rebuilt(cls: type[CkptlabError], key: str, params: dict[str, Any]) -> CkptlabError:
    """A :class:`CkptlabError` of ``cls`` from its pickled parts, without calling a subclass's own __init__."""
    error = cls.__new__(cls)
    CkptlabError.__init__(error, key=key, **params)
    return error


class SpecError(CkptlabError, ValueError):
    """A value of a run's spec is out of range (sequence length, batch size, every_n_layers, ...)."""


class ModelLoadError(CkptlabError):
    """A model name or directory that cannot be turned into a model (unknown, no config.json, ...)."""


class UnsupportedModelError(ModelLoadError):
    """A model the lab cannot checkpoint: not a text LM, or no ``GradientCheckpointingLayer``."""


class DoesNotFitError(CkptlabError):
    """A model that cannot even be built on this machine (predicted before trying, so nothing is killed).

    A step that runs out of memory once started is not an exception: ``measure`` returns
    a result with status ``"does_not_fit"``.
    """


class RunStoppedError(CkptlabError):
    """A run stopped before its end because its caller asked (a cancel, a time limit): nothing was measured."""


def not_one_of(name: str, value: object, choices: Iterable[object]) -> SpecError:
    """The one wording of a value outside its choices: ``dtype='float64' is not one of auto, float32, ...``."""
    return SpecError(
        key="spec.not_one_of", option=Option(name, value), name=name, value=value, choices=", ".join(map(str, choices))
    )


def check_whole_number(name: str, value: object, minimum: int = 1) -> None:
    """Raise :class:`SpecError` unless ``value`` is a whole number >= ``minimum`` (1 or 0; a bool is not a number).

    Raises:
        SpecError: naming the value and the least it may be.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(
            key="spec.whole_number" if minimum == 1 else "spec.whole_number_or_zero",
            option=Option(name, value),
            minimum=minimum,
            name=name,
            value=value,
        )


def check_at_most(name: str, value: int | float, maximum: int | float, why: Fact) -> None:
    """Raise :class:`SpecError` when ``value`` is above ``maximum``: a bound that keeps a run finite.

    Args:
        why: what the bound protects, a fact of its own (``Fact("bound.repeats")``: ``said.bound.repeats`` in the
            locale files), worded in the reader's language.

    Raises:
        SpecError: naming the value, the bound and why.
    """
    if value > maximum:
        raise SpecError(
            key="spec.at_most", option=Option(name, value), why=why, name=name, value=f"{value!r}", limit=maximum
        )


def expect_type(function: str, name: str, value: object, expected: type | tuple[type, ...], example: str) -> None:
    """Raise :class:`SpecError` unless ``value`` is an ``expected`` (a public function given the wrong kind of argument).

    Args:
        function: the public function, as a user calls it (``"ckptlab.measure"``).
        name: the argument.
        example: a call that works, for the message.

    Raises:
        SpecError: naming the function, the argument, what it expected and what it got.
    """
    if isinstance(value, expected) and not (isinstance(value, bool) and bool not in _as_tuple(expected)):
        return
    wanted = " or ".join(kind.__name__ for kind in _as_tuple(expected))
    raise SpecError(
        key="api.wrong_type",
        function=function,
        name=name,
        expected=wanted,
        got=type(value).__name__,
        example=example,
        value=value,
    )


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)
