"""Exceptions the lab raises for input it cannot run.

Every message names the offending value and says how to fix it, in the spirit of
``torch.utils.checkpoint``'s "To resolve this error, ...". Front ends catch
``CkptlabError`` and show its message; anything else is a bug.
"""

from __future__ import annotations


class CkptlabError(Exception):
    """Base class: a request the lab cannot carry out, with a message fit for a user."""


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
