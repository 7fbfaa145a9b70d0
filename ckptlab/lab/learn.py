"""The Learn pages' measurements: sets of runs through the lab's device queue, one shared model.

Each figure on the Timeline, Lesson and Exercises pages comes from a real run. They ask for
several settings at once (checkpointing off, every_n_layers=1, 2, ...), so
:func:`measure_all` calls :func:`ckptlab.lab.run.run_queued` for each: one measured run on
the device at a time across every session, and results reused from the process-wide
cache when another participant already measured the same settings.

The model is kept in one slot (:func:`shared_model`): the settings of a lesson differ only
in checkpointing, so one tiny model serves them all, and no second model stays alive to
count in another session's baseline on a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from transformers import PreTrainedModel

from ..model import catalog
from ..model.catalog import ModelInfo
from ..results import RunResult
from ..spec import RunSpec
from ..step.measure import Progress
from .run import ModelKey, baseline_spec, build_for_key, run_queued
from .runqueue import OnWait

_lock = threading.Lock()
_slot: dict[ModelKey, tuple[PreTrainedModel, ModelInfo]] = {}

LEARN_SEQ_LENS = (64, 128, 256, 512)  # short enough for ~1 s runs of a tiny preset on 2 CPU cores


def shared_model(key: ModelKey) -> tuple[PreTrainedModel, ModelInfo]:
    """The built model for ``key``, kept until another key is asked for (one model alive at a time)."""
    with _lock:
        if key not in _slot:
            _slot.clear()  # drop the previous model before building the next: one at a time
            _slot[key] = build_for_key(key)
        return _slot[key]


def cpu_presets() -> list[str]:
    """The presets a CPU runs in seconds (the tiny ones), in the catalog's order."""
    return [preset.name for preset in catalog.list_presets() if preset.cpu_ok]


def measure_all(
    specs: Sequence[RunSpec],
    *,
    progress: Progress | None = None,
    on_wait: OnWait | None = None,
    load: Callable[[ModelKey], tuple[PreTrainedModel, ModelInfo]] = shared_model,
    owner: str | None = None,
) -> dict[RunSpec, RunResult]:
    """Measure every spec (and its checkpointing-off baseline) through the device queue.

    Args:
        specs: the settings, in the order to run them.
        progress: ``(message, fraction)`` over the whole set.
        on_wait: called with the number of runs ahead while waiting for the device.
        load: builds or returns the model for a key.
        owner: who asks (the browser session), one place in the device queue at a time.

    Returns:
        Results by spec, the baselines included (under ``baseline_spec(spec)``).

    Raises:
        SpecError, ModelLoadError, DoesNotFitError, DeviceBusyError: as ``run_queued``.
    """
    report = progress or (lambda message, fraction: None)
    results: dict[RunSpec, RunResult] = {}
    unique = list(dict.fromkeys(specs))
    for index, spec in enumerate(unique):
        if spec in results:
            continue

        def scaled(message: str, fraction: float, index: int = index) -> None:
            report(message, (index + fraction) / len(unique))

        lab = run_queued(spec, load=load, progress=scaled, on_wait=on_wait, owner=owner)
        results[spec] = lab.result
        if lab.baseline is not None:
            results[baseline_spec(spec)] = lab.baseline.result
    report("done", 1.0)
    return results
