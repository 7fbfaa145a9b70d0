"""Exceptions the lab raises for input it cannot run.

Every message names the offending value and says how to fix it, in the spirit of
``torch.utils.checkpoint``'s "To resolve this error, ...". Front ends catch
``CkptlabError`` and show its message; anything else is a bug.

The message is English, the language of the CLI and of the code, written where the error
is raised (as gettext does, the source text lives in the source). An error a participant
can meet in the app also carries a ``key`` and its ``params``: the app looks up
``errors.<key>`` in its language's locale file and fills in the same params
(``ckptlab.show.i18n.error_text``), and falls back to the English message when a key has
no translation. So the core never needs to know the reader's language.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class CkptlabError(Exception):
    """Base class: a request the lab cannot carry out, with a message fit for a user.

    Args:
        message: the English text (what the CLI prints).
        key: the translation key under ``errors.`` in the locale files, or None (English everywhere).
        params: the values the translated text fills in (the same the English one names).
    """

    def __init__(self, message: str, *, key: str | None = None, **params: Any) -> None:
        super().__init__(message)
        self.key = key
        self.params = params

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled whole, whatever a subclass's __init__ takes: an error raised in a worker process
        # (ckptlab.lab.workers) crosses back with its key and params, so a page still says it in its language.
        return (_rebuilt, (type(self), str(self), self.key, self.params), dict(self.__dict__))


def _rebuilt(cls: type[CkptlabError], message: str, key: str | None, params: dict[str, Any]) -> CkptlabError:
    """A :class:`CkptlabError` of ``cls`` from its pickled parts, without calling a subclass's own __init__."""
    error = cls.__new__(cls)
    CkptlabError.__init__(error, message, key=key, **params)
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
    listed = ", ".join(map(str, choices))
    return SpecError(
        f"{name}={value!r} is not one of {listed}.", key="spec.not_one_of", name=name, value=value, choices=listed
    )


def check_whole_number(name: str, value: object, minimum: int = 1) -> None:
    """Raise :class:`SpecError` unless ``value`` is a whole number >= ``minimum`` (1 or 0; a bool is not a number).

    Raises:
        SpecError: naming the value and the least it may be.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(
            f"{name}={value!r} is not valid: it must be a whole number >= {minimum}.",
            key="spec.whole_number" if minimum == 1 else "spec.whole_number_or_zero",
            name=name,
            value=value,
        )


def check_at_most(name: str, value: int | float, maximum: int | float, why: str) -> None:
    """Raise :class:`SpecError` when ``value`` is above ``maximum``: a bound that keeps a run finite.

    Args:
        why: what the bound protects, in English, for the message (``"a median of 1000 steps is plenty"``).

    Raises:
        SpecError: naming the value, the bound and why.
    """
    if value > maximum:
        raise SpecError(
            f"{name}={value!r} is more than the lab runs (at most {maximum:,}): {why}.",
            key="spec.at_most",
            name=name,
            value=f"{value!r}",
            limit=f"{maximum:,}",
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
        f"{function}() expects {name} to be a {wanted}, not {type(value).__name__} {value!r:.80}. "
        f"For example: {example}",
        key="api.wrong_type",
        function=function,
        name=name,
        expected=wanted,
        got=type(value).__name__,
        example=example,
    )


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)
