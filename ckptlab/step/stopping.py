"""Stopping a step in flight when its caller asks: a participant's Cancel, a server's time limit.

A training step cannot be interrupted from outside its thread, so the step asks: a
forward pre-hook on every checkpointable layer calls ``should_stop()``, in the forward and
in the backward's reruns alike, and so do the progress reports between steps. When it
answers True, :class:`~ckptlab.errors.RunStoppedError` is raised from inside the step; it
unwinds through autograd like any Python error, and ``measure``'s own clean-up gives the
model back as it came. A step stops within one layer's work, not within one operation:
a single huge matmul still runs to its end.

Between runs a longer job (a sweep, a table of simulations) asks a :data:`Cancel` through
:func:`stopper`, and reports each run's progress as a share of its own with :func:`scaled`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..errors import RunStoppedError
from ..fact import Fact, worded
from ..model.plan import checkpointable_layers

ShouldStop = Callable[[], bool]
# (what is happening, as a fact a page or the command line words; fraction done in [0, 1])
Progress = Callable[[Fact, float], None]
Cancel = Callable[[], bool] | threading.Event  # a job's stop button: an event, or a function that says so
# Where the Python API says what a run is doing, one line a phase at INFO (as transformers logs through ``logging``):
# silent until the caller turns it on (``logging.basicConfig(level=logging.INFO)``, README's example), never printed.
PROGRESS_LOG = logging.getLogger("ckptlab.progress")


def stop_if_asked(should_stop: ShouldStop | None) -> None:
    """Raise :class:`RunStoppedError` when ``should_stop()`` says so."""
    if should_stop is not None and should_stop():
        raise RunStoppedError(key="run.stopped")


@contextmanager
def stoppable(model: torch.nn.Module, should_stop: ShouldStop | None) -> Iterator[None]:
    """Ask ``should_stop`` at the start of every checkpointable layer's forward (and rerun) inside the block."""
    if should_stop is None:
        yield
        return

    def ask(module: torch.nn.Module, args: object) -> None:
        stop_if_asked(should_stop)

    handles = [layer.register_forward_pre_hook(ask) for layer in checkpointable_layers(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def checked(report: Progress, should_stop: ShouldStop | None) -> Progress:
    """``report`` that first asks ``should_stop``: the moments between two steps."""

    def ask_then_report(message: Fact, fraction: float) -> None:
        stop_if_asked(should_stop)
        report(message, fraction)

    return ask_then_report


def logged(report: Progress | None) -> Progress:
    """``report`` (or nothing) that also logs each new message at INFO on :data:`PROGRESS_LOG`, in English (the
    fact worded through the one word path), with the percent done: a script's long wait says what it is doing once
    its logging shows INFO, and says nothing otherwise. A message repeated with a new fraction is logged once."""
    last: list[Fact | None] = [None]

    def log_then_report(message: Fact, fraction: float) -> None:
        if message != last[0] and PROGRESS_LOG.isEnabledFor(logging.INFO):
            last[0] = message
            PROGRESS_LOG.info("%3.0f%% %s", 100 * fraction, worded(message))
        if report is not None:
            report(message, fraction)

    return log_then_report


def stopper(cancel: Cancel | None) -> ShouldStop:
    """A function that says whether ``cancel`` (an event, a function or None) asks to stop."""
    if cancel is None:
        return lambda: False
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel


DONE = Fact("progress.done")  # the last progress message of a run or a job


def prefixed(prefix: Fact | None, message: Fact) -> Fact:
    """``message`` after ``prefix`` (which run of a job it is about), both kept as facts; ``message`` without one."""
    return message if prefix is None else Fact("progress.prefixed", {"prefix": prefix, "message": message})


def label(text: str) -> Fact:
    """The prefix ``"<text>: "`` of a progress line, for a label that is a name or a setting's key (``n=2``)."""
    return Fact("progress.label", {"label": text})


def spanned(report: Progress, start: float, width: float, prefix: Fact | None = None) -> Progress:
    """Progress of a part of a job that spans ``start`` to ``start + width`` of the whole (shares of its predicted
    time, so that the job's fraction moves as its time does), its messages after ``prefix``."""

    def report_share(message: Fact, fraction: float) -> None:
        report(prefixed(prefix, message), start + fraction * width)

    return report_share


def scaled(report: Progress, index: int, total: int, prefix: Fact | None = None) -> Progress:
    """Progress of the ``index``-th of ``total`` runs as a share of the whole job's, its messages after ``prefix``."""

    def report_share(message: Fact, fraction: float) -> None:
        report(prefixed(prefix, message), (index + fraction) / total)

    return report_share
